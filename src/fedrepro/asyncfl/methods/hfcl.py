"""HFCL (hybrid federated and centralised learning, Elbir et al. 2021): in every round where updates
arrived, the server trains like one more client (the clients' local epochs, learning rate and batch size,
plain SGD) from the current model on its in-domain data, with no delay, and its update is averaged in with
the clients' (weighted by sample counts). ``epochs`` and ``batch_size`` replace the clients' values (Table 6
fixes every server's number of iterations)."""

from __future__ import annotations

from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, Update
from fedrepro.asyncfl.server_train import train_vector


class HFCL(AsyncMethod):
    name = "hfcl"

    def __init__(self, epochs: int | None = None, batch_size: int | None = None) -> None:
        super().__init__()
        self.server_data = "in_domain"
        self.epochs, self.batch_size = epochs, batch_size

    def round_end(self, w: Tensor, rnd: int) -> Tensor:
        if not self._arrived:
            return w
        cfg, n = self.run.cfg, len(self.run.server_y)
        self.load_global_buffers()  # the server client trains from the global model, statistics included
        self.model.train()
        w_server = train_vector(self.flat, w, self.server_ce, n, self.epochs or cfg.local_epochs, cfg.lr,
                                self.batch_size or cfg.batch_size, self.server_generator(rnd))
        buffers = self.flat.buffers() if self.run.global_buffers is not None else None
        self._arrived.append(Update(cid=-1, delta=w_server - w, w_start=w, dispatch_round=rnd, staleness=0,
                                    num_samples=n, buffers=buffers))
        return super().round_end(w, rnd)
