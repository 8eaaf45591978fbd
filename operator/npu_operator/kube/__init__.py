"""Kubernetes itself: the asyncio client, the well-known names and labels of the objects we create or
read (ours and the upstream controllers'), owner chains, and small object helpers."""
