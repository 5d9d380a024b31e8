"""federated."""
