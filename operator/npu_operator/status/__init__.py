"""What the pods and their runtimes say, and the resource's status made of it: the reports (bounded,
typed), findings, `status.graph`, conditions and Events, the model download, calibration, revisions."""
