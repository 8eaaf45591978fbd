"""The router of a prefill/decode pair (`npu-runtime route`)."""
