"""fedrepro: regenerate federated-learning papers end to end."""

__version__ = "0.1.0"
