"""HFCL (hybrid federated and centralised learning, Elbir et al. 2021): in every round where updates
arrived, the server trains like one more client from the current model on its in-domain data, with no delay,
and its update is averaged in with the clients' (weighted by sample counts). "Like a client" is the clients'
optimiser itself (sim/sync.py ``FederatedRun.local_sgd``: their learning rate, momentum and weight decay, a
fresh momentum buffer each round) and their local epochs and batch size; ``epochs`` and ``batch_size`` replace
the clients' values (Table 6 fixes every server's number of iterations). Its training updates the BatchNorm
statistics it starts from (the global ones), which are merged like a client's."""

from __future__ import annotations

from torch import Tensor

from fedrepro.algorithms.base import Client
from fedrepro.asyncfl.base import AsyncMethod, ServerPass, ServerWork, Update
from fedrepro.asyncfl.server_train import batches
from fedrepro.plugins import PositiveInt

SERVER_CLIENT = -1  # the server's client id in its Update


class HFCL(AsyncMethod):
    name = "hfcl"

    def __init__(self, epochs: PositiveInt | None = None, batch_size: PositiveInt | None = None) -> None:
        super().__init__()
        self.server_data = "in_domain"
        self.epochs, self.batch_size = epochs, batch_size

    def server_passes(self, work: ServerWork) -> list[ServerPass]:  # a client's training, with its own values
        return [ServerPass(work.rounds * (self.epochs or work.local_epochs) * work.samples,
                           self.batch_size or work.client_batch, True)]

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        if not self._arrived:
            return w
        run = self.run
        cfg, n = run.cfg, len(run.server_y)
        self.flat.load(w)
        self.load_global_buffers()  # the server client trains from the global model, statistics included
        self.model.train()
        order = batches(n, self.batch_size or cfg.batch_size, self.epochs or cfg.local_epochs,
                        self.server_generator(rnd), w.device)
        run.clients.local_sgd(Client(cid=SERVER_CLIENT, round=rnd, w_start=w, num_samples=n),
                              run.server_x, run.server_y, order)
        buffers = self.flat.buffers() if run.global_buffers is not None else None
        self._arrived.append(Update(cid=SERVER_CLIENT, delta=self.flat.w.detach() - w, w_start=w,
                                    dispatch_round=rnd, staleness=0, num_samples=n, buffers=buffers))
        return super().server_end(w, rnd)
