"""The Kubernetes API in memory, over real HTTP: `emulator.KubeEmulator` and the steps it is made of.

`emulator` is the HTTP face: it takes a request through authentication and RBAC (`access`),
admission and validation (`admission`, `apply`, `subresources`), storage (`store`), list and watch
(`watch`, `selectors`, `tables`), and discovery and OpenAPI (`discovery`). The modules below those
hold what each step knows: built-in resources (`resources`), CRDs (`custom_resources`,
`custom_apis`), managed fields (`fields`), OpenAPI (`openapi`, `openapi_v2_proto`), protobuf
bodies (`kube_protobuf`), RBAC rules (`rbac`). Nothing here imports the rest of the sandbox.
"""
