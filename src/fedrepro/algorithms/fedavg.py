"""FedAvg: the base hooks unchanged."""

from fedrepro.algorithms.base import Algorithm


class FedAvg(Algorithm):
    name = "fedavg"
