"""The node: a kubelet that runs the sandbox's Pod objects as processes on this machine (`kubelet`)."""
