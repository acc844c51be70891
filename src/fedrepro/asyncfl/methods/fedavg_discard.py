"""FedAvg as Feddle's Eq. 3 describes synchronous FL under delays: the server averages the updates of the clients it
sent the model this round (sample-weighted, as FedAvg) and discards every delayed one ("delayed updates are
discarded"); the base class (asyncfl/base.py) is the other reading, every arrived update averaged however stale.
A client whose update was discarded is free to be sampled again, as after any arrival."""

from __future__ import annotations

from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, Update


class FedAvgDiscard(AsyncMethod):
    name = "fedavg_discard"

    def server_receive(self, w: Tensor, update: Update) -> Tensor:
        if update.staleness > 0:
            self.state["discarded"] = self.state.get("discarded", 0) + 1
            return w
        return super().server_receive(w, update)

    def round_metrics(self) -> dict[str, float]:
        return {"discarded": float(self.state.get("discarded", 0))}
