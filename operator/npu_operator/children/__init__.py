"""Pure builders: a spec (+ the operator's settings) in, child manifests out; the child-kind table.

No client, no clock, no randomness: the same input gives byte-identical manifests. Which children a
resource gets is its topology's choice (`npu_operator.topologies`).
"""
