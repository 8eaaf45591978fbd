"""The operator's inputs: the NPUInference CRD and its typed spec, the checks beyond its schema, the
roles a disaggregated spec derives, and the operator's own settings and pod-template policy.

The bottom floor: imports nothing else of the operator.
"""
