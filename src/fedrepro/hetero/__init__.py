"""Federated learning with heterogeneous client models (FedL2G and its baselines): the engine, the method
hooks and the methods, one file each in ``methods/``."""
