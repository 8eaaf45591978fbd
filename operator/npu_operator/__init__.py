"""The npu-operator: reconciles NPUInference resources into runtime pods and reports their status."""
