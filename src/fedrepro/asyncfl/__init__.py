"""Asynchronous federated learning (Feddle and its baselines): delayed client updates, server-side data."""
