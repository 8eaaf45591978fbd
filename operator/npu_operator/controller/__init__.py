"""The running operator: kopf's handlers (thin), a worker per resource, the reconcile pipeline, the
watches and the supervision of kopf itself."""
