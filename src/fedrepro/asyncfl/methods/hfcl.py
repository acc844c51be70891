"""HFCL (hybrid federated and centralised learning, Elbir et al. 2021): in every round where updates
arrived, the server trains like one more client (the clients' local epochs, learning rate and batch size,
plain SGD) from the current model on its in-domain data, with no delay, and its update is averaged in with
the clients' (weighted by sample counts). No hyper-parameters of its own."""

from __future__ import annotations

from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, Update
from fedrepro.asyncfl.server_train import train_vector


class HFCL(AsyncMethod):
    name = "hfcl"

    def __init__(self) -> None:
        super().__init__()
        self.server_data = "in_domain"

    def round_end(self, w: Tensor, rnd: int) -> Tensor:
        if not self._arrived:
            return w
        cfg, n = self.run.cfg, len(self.run.server_y)
        w_server = train_vector(self.flat, w, self.server_ce, n, cfg.local_epochs, cfg.lr, cfg.batch_size,
                                self.server_generator(rnd))
        self._arrived.append(Update(cid=-1, delta=w_server - w, w_start=w, dispatch_round=rnd, staleness=0,
                                    num_samples=n))
        return super().round_end(w, rnd)
