"""FedDF (Lin et al., 2020): FedAvg's aggregate of the arrived updates, then distilled from the ensemble of
the arrived client models (w_start + Delta each) on the server images: the student minimises
T^2 KL(softmax(mean_i f_i / T) || softmax(f / T)) for ``epochs`` passes (Adam, as FedDF): the teacher is the
softmax of the clients' averaged logits (Lin et al. 2020, Algorithm 1), not the mean of their softmax outputs.
The server images are in-domain or out-of-domain (``server_data``); their labels are never used. Teachers run
in eval mode with their own BatchNorm statistics; the student trains in train mode and keeps the merged client
statistics (the server images are no client's data: asyncfl/base.py's rule)."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from fedrepro.asyncfl.base import AsyncMethod, ServerData, ServerPass, ServerWork
from fedrepro.asyncfl.server_train import train_vector
from fedrepro.plugins import Positive, PositiveInt
from fedrepro.sim.tensors import eval_mode, in_inference_batches


class FedDF(AsyncMethod):
    name = "feddf"

    def __init__(self, server_data: ServerData = "in_domain", lr: Positive = 1e-3, epochs: PositiveInt = 1,
                 batch_size: PositiveInt = 64, temperature: Positive = 1.0) -> None:
        super().__init__()
        self.server_data = server_data
        self.lr, self.epochs, self.batch_size, self.temperature = lr, epochs, batch_size, temperature

    def server_passes(self, work: ServerWork) -> list[ServerPass]:  # every arrived client model is a teacher
        return [ServerPass(work.rounds * work.clients_per_round * work.samples, None, False),
                ServerPass(work.rounds * self.epochs * work.samples, self.batch_size, True)]

    @torch.no_grad()
    def ensemble_probs(self, x: Tensor, teachers: list[Tensor], buffers: list[Tensor | None] | None = None) -> Tensor:
        """softmax(mean_i logits_i / T) on ``x`` over ``teachers`` (flat vectors; with ``buffers``, each with its
        BatchNorm statistics), every teacher in eval mode."""
        summed = None
        buffers = buffers or [None] * len(teachers)
        for vec, buf in zip(teachers, buffers, strict=True):
            state = {**self.flat.as_params(vec), **(self.flat.as_buffers(buf) if buf is not None else {})}
            with eval_mode(self.model):
                logits = in_inference_batches(partial(functional_call, self.model, state), x)
            summed = logits if summed is None else summed + logits
        return F.softmax(summed / len(teachers) / self.temperature, dim=1)

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        if not self._arrived:
            return w
        teachers = [u.w_start + u.delta for u in self._arrived]
        teacher_buffers = [u.buffers for u in self._arrived]
        w = super().server_end(w, rnd)
        x, t = self.run.server_x, self.temperature
        target = self.ensemble_probs(x, teachers, teacher_buffers)
        self.load_global_buffers()  # the student: the merged model, statistics included
        self.model.train()

        def distill(idx: Tensor) -> Tensor:
            log_p = F.log_softmax(self.model(x[idx]) / t, dim=1)
            return F.kl_div(log_p, target[idx], reduction="batchmean") * t * t

        return train_vector(self.flat, w, distill, len(x), self.epochs, self.lr, self.batch_size,
                            self.server_generator(rnd), "adam")
