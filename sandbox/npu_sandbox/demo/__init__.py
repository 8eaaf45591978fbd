"""`npu-sandbox`: the whole chain told as a story on this machine (`cli`), and the steps it is told in.

`cli` parses the command line and tells the story step by step; `helm` installs, upgrades and
uninstalls the chart with the real helm; `manifests` prepares what is applied; `steps` waits for
Ready and tries what the options ask for; `probes` and `reports` are what a user looks at and what
the summary holds; `prometheus` runs a real Prometheus; `printer` prints kubectl's layout;
`console` is what the story says. The demo sits on top: nothing else in the sandbox imports it.
"""
