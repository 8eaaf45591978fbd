"""The Kubernetes API in memory, over real HTTP: `emulator.KubeEmulator` and what it knows.

Beside the emulator: managed fields (`fields`), CRDs (`custom_resources`), OpenAPI (`openapi`,
`openapi_v2_proto`), protobuf bodies (`kube_protobuf`), RBAC rules (`rbac`), server-side Tables
(`printer`). Nothing here imports the rest of the sandbox.
"""
