"""Fetching: a model repository from a hub into the shared cache (`npu-runtime fetch`)."""
