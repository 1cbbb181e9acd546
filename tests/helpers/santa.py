"""The one-query SANTA problem whose estimate is checked for bias (tests/test_santa_static.py and
the GPU diagnostic benchmarks/check_santa_groups.py): replicates of one query as the query
heads of many KV heads holding the same keys, so one launch gives `reps` independent estimates."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ReplicateProblem:
    q: torch.Tensor          # [1, 1, d]
    k: torch.Tensor          # [1, 1, slots, d]
    v: torch.Tensor
    mask: torch.Tensor       # bool [slots]: the pattern's keys (two dropped)
    static: torch.Tensor     # bool [slots]: the keys attended exactly (sinks and a window)
    scores: torch.Tensor     # float64 [slots]: q k / sqrt(d)
    exact: torch.Tensor      # float64 [d]: exact attention over `mask`

    def replicates(self, reps: int, group: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [1, reps, d] and k, v [1, reps // group, slots, d] on `device`."""
        hkv = reps // group
        slots, d = self.k.shape[2], self.k.shape[3]
        return (self.q.expand(1, reps, d).to(device), self.k.expand(1, hkv, slots, d).contiguous().to(device),
                self.v.expand(1, hkv, slots, d).contiguous().to(device))


def replicate_problem() -> ReplicateProblem:
    g = torch.Generator().manual_seed(11)
    slots, d = 40, 16
    q = torch.randn(1, 1, d, generator=g) * 1.5
    k, v = torch.randn(1, 1, slots, d, generator=g), torch.randn(1, 1, slots, d, generator=g)
    mask = torch.ones(slots, dtype=torch.bool)
    mask[[5, 20]] = False
    static = torch.zeros(slots, dtype=torch.bool)
    static[[0, 1, 33, 34, 35, 36, 37, 38, 39]] = True
    s = (k[0, 0].double() @ q[0, 0].double()) / d ** 0.5
    exact = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v[0, 0].double()
    return ReplicateProblem(q, k, v, mask, static, s, exact)
