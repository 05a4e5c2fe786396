"""The travelling salesman problem for the capstone: instances, tour lengths, two classic
construction heuristics, the Attention Model of Kool, van Hoof and Welling (ICLR 2019) with its
attention running through `flashlab.attention`, and inference that decodes many tours per
instance and keeps the shortest (POMO's multi-start and ×8 augmentation, sampling).

Instances are ``(batch, n, 2)`` coordinates, uniform in the unit square; a tour is a
``(batch, n)`` permutation of node indices, closed (the salesman returns to the start).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from flashlab.api.attention import attention, attention_qkvpacked

from . import checkpoint
from .config import ConfigError, FieldsChecked, check_fields, option, stored_problem

# Kool et al. 2019, Table 1 (greedy decoding): optimal tour length and the AM's own result.
PUBLISHED = {20: {"optimal": 3.84, "am_greedy": 3.85}, 50: {"optimal": 5.70, "am_greedy": 5.80},
             100: {"optimal": 7.76, "am_greedy": 8.12}}


# Tours decoded at once by the inference modes, which bounds their memory, per device
EVAL_MAX_ROLLOUTS = {"cpu": 4096, "cuda": 32768}


def random_instances(batch: int, n_nodes: int, seed: int, device="cpu") -> torch.Tensor:
    """``batch`` instances of ``n_nodes`` cities, uniform in [0, 1]², a function of ``seed``."""
    return torch.rand(batch, n_nodes, 2, generator=torch.Generator().manual_seed(seed)).to(device)


def tour_length(coords: torch.Tensor, tours: torch.Tensor) -> torch.Tensor:
    """Length of each closed tour: Σ_i ‖x[t_i+1] − x[t_i]‖ with t_n = t_0. Checks that each
    tour visits every node exactly once."""
    n = coords.shape[1]
    if tours.shape != coords.shape[:2]:
        raise ValueError(f"tours: shape {tuple(tours.shape)} should be (batch, n) = {tuple(coords.shape[:2])}.")
    if not torch.equal(tours.sort(dim=1).values, torch.arange(n, device=tours.device).expand_as(tours)):
        raise ValueError("tours: every row must be a permutation of 0..n-1 (each city exactly once).")
    ordered = coords.gather(1, tours[..., None].expand(-1, -1, 2))
    return (ordered - ordered.roll(-1, dims=1)).norm(dim=-1).sum(1)


def nearest_neighbour(coords: torch.Tensor, start: int = 0) -> torch.Tensor:
    """From ``start``, always go to the closest unvisited city (all instances at once)."""
    batch, n, _ = coords.shape
    dist = torch.cdist(coords, coords)
    visited = torch.zeros(batch, n, dtype=torch.bool, device=coords.device)
    current = torch.full((batch,), start, dtype=torch.long, device=coords.device)
    tour = [current]
    rows = torch.arange(batch, device=coords.device)
    for _ in range(n - 1):
        visited[rows, current] = True
        current = dist[rows, current].masked_fill(visited, float("inf")).argmin(1)
        tour.append(current)
    return torch.stack(tour, 1)


def farthest_insertion(coords: torch.Tensor) -> torch.Tensor:
    """Start from the two farthest-apart cities; repeatedly take the unvisited city farthest
    from the tour (max over cities of the min distance to the tour) and insert it where it
    lengthens the tour least (all instances at once)."""
    batch, n, _ = coords.shape
    if n < 3:
        return torch.arange(n, device=coords.device).expand(batch, n).clone()
    dist = torch.cdist(coords, coords)
    rows = torch.arange(batch, device=coords.device)
    first = dist.flatten(1).argmax(1)
    a, b = first // n, first % n
    tour = torch.stack([a, b], 1)                                      # (batch, k), grows to n
    in_tour = torch.zeros(batch, n, dtype=torch.bool, device=coords.device)
    in_tour[rows, a] = in_tour[rows, b] = True
    to_tour = torch.minimum(dist[rows, a], dist[rows, b])              # each city's distance to the tour
    for _ in range(n - 2):
        city = to_tour.masked_fill(in_tour, -1.0).argmax(1)             # farthest from the tour
        nxt = tour.roll(-1, dims=1)
        d_city = dist[rows, city]                                      # (batch, n)
        cost = d_city.gather(1, tour) + d_city.gather(1, nxt) - dist[rows[:, None], tour, nxt]
        pos = cost.argmin(1) + 1                                        # insert after position pos − 1
        k = tour.shape[1]
        idx = torch.arange(k + 1, device=coords.device).expand(batch, -1)
        source = torch.where(idx < pos[:, None], idx, idx - 1).clamp(max=k - 1)
        tour = torch.where(idx == pos[:, None], city[:, None], tour.gather(1, source))
        in_tour[rows, city] = True
        to_tour = torch.minimum(to_tour, d_city)
    return tour


def masked_glimpse(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visited: torch.Tensor,
                   attention_fn=attention) -> torch.Tensor:
    """The decoder's glimpse: each instance's context query ``(batch, heads, 1, d)`` attends
    over its cities' keys and values ``(batch, heads, n, d)`` with the visited cities
    (``visited (batch, n)``, True = visited) masked out; at least one city is unvisited."""
    return attention_fn(query, keys, values, attn_mask=~visited[:, None, None, :])   # (batch, 1, 1, n) keep


def pointer_log_probs(glimpse: torch.Tensor, logit_keys: torch.Tensor, visited: torch.Tensor,
                      tanh_clip: float) -> torch.Tensor:
    """log p(next city) ``(batch, n)`` in float32: one more single-head attention score,
    u_j = C·tanh(glimpse · k_j / √d), with visited cities at −inf before the log-softmax."""
    logits = torch.einsum("bd,bnd->bn", glimpse, logit_keys) / math.sqrt(glimpse.shape[-1])
    logits = (tanh_clip * torch.tanh(logits)).masked_fill(visited, float("-inf"))
    return F.log_softmax(logits.float(), dim=-1)


class EncoderLayer(nn.Module):
    """Multi-head self-attention and a feed-forward layer, each with a skip connection and
    batch normalisation (Kool et al. §3.1)."""

    def __init__(self, embed_dim: int, n_heads: int, ff_dim: int, attention_fn):
        super().__init__()
        self.n_heads, self.attention_fn = n_heads, attention_fn
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=False)
        self.out = nn.Linear(embed_dim, embed_dim, bias=False)
        self.norm1, self.norm2 = nn.BatchNorm1d(embed_dim), nn.BatchNorm1d(embed_dim)
        self.ff = nn.Sequential(nn.Linear(embed_dim, ff_dim), nn.ReLU(), nn.Linear(ff_dim, embed_dim))

    @staticmethod
    def _norm(norm, x):
        return norm(x.flatten(0, 1)).view_as(x)

    def forward(self, x):
        batch, n, dim = x.shape
        qkv = self.qkv(x).view(batch, n, 3, self.n_heads, dim // self.n_heads)
        if self.attention_fn is attention:   # dQ, dK, dV written in qkv's layout: no gathering copies
            h = attention_qkvpacked(qkv)
        else:                                # split along dimension 2: one copy gathers the gradients
            h = self.attention_fn(*(t.transpose(1, 2) for t in qkv.unbind(2))).transpose(1, 2)
        h = h.reshape(batch, n, dim)
        x = self._norm(self.norm1, x + self.out(h))
        return self._norm(self.norm2, x + self.ff(x))


class DecoderCache(NamedTuple):
    """What the decoder computes once per instance and reads at every step. Multi-start and
    augmentation decode many tours of one instance: they repeat this, not the encoder."""

    nodes: torch.Tensor       # (batch, n, dim) node embeddings: the step context takes the first and last city's
    graph: torch.Tensor       # (batch, dim) the graph embedding (mean of the nodes), projected
    glimpse_k: torch.Tensor   # (batch, heads, n, dim / heads) the glimpse's keys
    glimpse_v: torch.Tensor   # (batch, heads, n, dim / heads) the glimpse's values
    logit_k: torch.Tensor     # (batch, n, dim) the pointer's keys

    def repeat_interleave(self, times: int) -> DecoderCache:
        """Each instance's rows ``times`` times in a row: its tours side by side in the batch.
        (An expand and a copy: no index tensor, so nothing waits on a GPU or breaks a CUDA graph.)"""
        return DecoderCache(*(t[:, None].expand(-1, times, *t.shape[1:]).flatten(0, 1) for t in self))


class AttentionModel(nn.Module):
    """Kool et al.'s Attention Model: an encoder of ``n_layers`` attention layers over the
    cities, and a decoder that, step by step, builds a context query from the graph
    embedding and the first and last city, attends (``n_heads`` glimpse heads) to the cities
    not yet visited (a boolean key mask), and scores them with one more head whose logits are
    clipped with ``C · tanh``. ``attention_fn`` is any function with SDPA's arguments."""

    def __init__(self, embed_dim: int = 128, n_heads: int = 8, n_layers: int = 3, ff_dim: int = 512,
                 tanh_clip: float = 10.0, attention_fn=attention):
        super().__init__()
        self.n_heads, self.tanh_clip, self.attention_fn = n_heads, tanh_clip, attention_fn
        self.init_embed = nn.Linear(2, embed_dim)
        self.layers = nn.ModuleList(EncoderLayer(embed_dim, n_heads, ff_dim, attention_fn) for _ in range(n_layers))
        self.project_nodes = nn.Linear(embed_dim, 3 * embed_dim, bias=False)   # glimpse keys, values, logit keys
        self.project_graph = nn.Linear(embed_dim, embed_dim, bias=False)
        self.project_step = nn.Linear(2 * embed_dim, embed_dim, bias=False)
        self.project_out = nn.Linear(embed_dim, embed_dim, bias=False)
        self.first_placeholder = nn.Parameter(torch.empty(2 * embed_dim).uniform_(-1, 1))

    def encode(self, coords):
        # coordinates arrive in fp32; a model cast to bf16 or fp16 (train-tsp --precision bf16-true)
        # takes them in its own dtype (a no-op in fp32; autocast casts for the mixed modes anyway)
        x = self.init_embed(coords.to(self.init_embed.weight.dtype))
        for layer in self.layers:
            x = layer(x)
        return x

    def precompute(self, nodes: torch.Tensor) -> DecoderCache:
        """What the decoder reads at every step, computed once from the node embeddings."""
        batch, n, dim = nodes.shape
        glimpse_k, glimpse_v, logit_k = self.project_nodes(nodes).chunk(3, dim=-1)
        split = lambda t: t.view(batch, n, self.n_heads, dim // self.n_heads).transpose(1, 2)  # (batch, heads, n, d)
        return DecoderCache(nodes, self.project_graph(nodes.mean(1)), split(glimpse_k), split(glimpse_v), logit_k)

    def forward(self, coords: torch.Tensor, decode: str = "greedy", trace: list | None = None, *,
                multi_start: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Tours ``(batch, n)`` and the sum of their log-probabilities ``(batch,)``: the encoder,
        then `decode`. ``multi_start``: n tours per instance, one from each city as the first
        (POMO), ``(batch · n, n)`` with each instance's tours side by side; the instance is
        encoded once."""
        cache, first_city = self.precompute(self.encode(coords)), None
        if multi_start:
            batch, n, _ = coords.shape
            cache = cache.repeat_interleave(n)
            first_city = torch.arange(n, device=coords.device).repeat(batch)
        return self.decode(cache, decode, trace, first_city=first_city)

    def decode(self, cache: DecoderCache, decode: str = "greedy", trace: list | None = None, *,
               first_city: torch.Tensor | None = None, temperature: float = 1.0,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Build one tour per row of ``cache``. ``decode``: "greedy" (most probable city each
        step) or "sample" (drawn from the softmax of the log-probabilities divided by
        ``temperature``, with ``generator``'s random numbers). ``first_city`` ``(batch,)``:
        each tour's first city, given (multi-start, as POMO and RL4CO do): the decoder then
        starts from the context (first city, first city) instead of its learned placeholder,
        and the forced city adds nothing to the log-probability. ``trace``: a list that
        receives, step by step, the probability of every city ``(batch, n)`` (visited ones 0),
        to look inside the decoder."""
        if decode not in ("greedy", "sample"):
            raise ValueError(f"decode: {decode!r} is not 'greedy' or 'sample'.")
        nodes, graph, glimpse_k, glimpse_v, logit_k = cache
        batch, n, dim = nodes.shape
        heads = self.n_heads
        rows = torch.arange(batch, device=nodes.device)
        visited = torch.zeros(batch, n, dtype=torch.bool, device=nodes.device)
        tour, log_probs = [], []
        if first_city is None:
            first, step_context = None, self.first_placeholder.expand(batch, -1)
        else:
            first = first_city
            tour.append(first)
            visited[rows, first] = True
            step_context = torch.cat([nodes[rows, first], nodes[rows, first]], dim=-1)
        for _ in range(n - len(tour)):
            query = (graph + self.project_step(step_context)).view(batch, heads, 1, dim // heads)
            glimpse = masked_glimpse(query, glimpse_k, glimpse_v, visited, self.attention_fn)
            glimpse = self.project_out(glimpse.transpose(1, 2).reshape(batch, dim))
            log_p = pointer_log_probs(glimpse, logit_k, visited, self.tanh_clip)
            if trace is not None:
                trace.append(log_p.detach().exp())
            if decode == "greedy":
                city = log_p.argmax(1)
            else:   # log_p / T is the log-softmax of logits / T up to a constant per row: softmax removes it
                probs = log_p.exp() if temperature == 1 else F.softmax(log_p / temperature, dim=-1)
                city = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            tour.append(city)
            log_probs.append(log_p[rows, city])
            visited = visited.clone()
            visited[rows, city] = True
            first = city if first is None else first
            step_context = torch.cat([nodes[rows, first], nodes[rows, city]], dim=-1)
        return torch.stack(tour, 1), torch.stack(log_probs, 1).sum(1)

    @torch.no_grad()
    def greedy_tours(self, coords: torch.Tensor, batch_size: int = 1000) -> torch.Tensor:
        """Greedy tours for many instances, in chunks (evaluation mode)."""
        self.eval()
        return torch.cat([self(coords[i:i + batch_size])[0] for i in range(0, len(coords), batch_size)])


# ---------------------------------------------------------------- inference that spends compute for quality
# Greedy decoding gives one tour per instance. Decoding many and keeping the shortest costs more
# time and finds shorter tours: from every city as the first (multi-start), on the instance's 8
# mirror images (augmentation), or by sampling. Each tour is checked and measured on the
# instance's own coordinates (`tour_length`).

def symmetric_views(coords: torch.Tensor) -> torch.Tensor:
    """The 8 symmetries of the unit square applied to every instance ``(batch, n, 2)``:
    ``(batch, 8, n, 2)``, the identity first (POMO's ×8 augmentation). Each maps the square
    onto itself and keeps every distance, so a tour of a view is a tour of the instance, of
    the same length; the model, which sees coordinates, may find a different tour."""
    x, y = coords.unbind(-1)
    views = [(x, y), (y, x), (1 - x, y), (x, 1 - y), (1 - x, 1 - y), (y, 1 - x), (1 - y, x), (1 - y, 1 - x)]
    return torch.stack([torch.stack(view, dim=-1) for view in views], dim=1)


@torch.no_grad()
def rollouts(model: AttentionModel, coords: torch.Tensor, augment: int = 1, starts: int = 0, samples: int = 0,
             temperature: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Many tours of each instance, decoded side by side in one batch: ``(batch, R, n)``. Each
    of the first ``augment`` `symmetric_views` of an instance (1: the instance itself; 8: all)
    is encoded once; its `DecoderCache` is repeated for each first city 0 … ``starts`` − 1
    (0: the model picks its first city itself) and, with ``samples`` > 0, for each of that
    many sampled tours (0: greedy). R = augment · max(starts, 1) · max(samples, 1). The model
    runs in the mode it is in (`best_tours` puts it in evaluation mode)."""
    batch, n, _ = coords.shape
    views = symmetric_views(coords)[:, :augment].flatten(0, 1)             # (batch · augment, n, 2)
    per_view = max(starts, 1) * max(samples, 1)
    cache = model.precompute(model.encode(views)).repeat_interleave(per_view)
    first_city = None
    if starts:                                                              # view-major, then start, then sample
        first_city = torch.arange(starts, device=coords.device).repeat_interleave(max(samples, 1))
        first_city = first_city.repeat(len(views))
    tours, _ = model.decode(cache, "sample" if samples else "greedy", first_city=first_city,
                            temperature=temperature, generator=generator)
    return tours.view(batch, -1, n)


def shortest_tours(coords: torch.Tensor, tours: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The shortest of each instance's tours ``(batch, R, n)``, and its length ``(batch,)``,
    every tour checked and measured on the instance's coordinates ``(batch, n, 2)``."""
    batch, r, n = tours.shape
    lengths = tour_length(coords.repeat_interleave(r, dim=0), tours.flatten(0, 1)).view(batch, r)
    best = lengths.argmin(1)
    rows = torch.arange(batch, device=coords.device)
    return tours[rows, best], lengths[rows, best]


def check_inference_options(n_nodes: int, augment: int, starts: int, samples: int, temperature: float,
                            max_rollouts: int) -> None:
    """Raise ValueError, naming the argument and what to give, for options `best_tours` cannot use."""
    if augment not in (1, 8):
        raise ValueError(f"augment: {augment} views; give 1 (the instance itself) or 8 (its 8 symmetric views).")
    if not 0 <= starts <= n_nodes:
        raise ValueError(f"starts: {starts} first cities for {n_nodes}-city instances; give 0 (the model's own "
                         f"first city) to {n_nodes} (every city).")
    if samples < 0:
        raise ValueError(f"samples: {samples}; give 0 (greedy) or a positive number of sampled tours.")
    if not temperature > 0:
        raise ValueError(f"temperature: {temperature}; give a positive number (1: the model's own probabilities).")
    if max_rollouts < 1:
        raise ValueError(f"max_rollouts: {max_rollouts}; give a positive number of tours to decode at once.")


def rollouts_per_instance(augment: int = 1, starts: int = 0, samples: int = 0) -> int:
    """How many tours `rollouts` decodes per instance."""
    return augment * max(starts, 1) * max(samples, 1)


def best_tours(model: AttentionModel, coords: torch.Tensor, augment: int = 1, starts: int = 0, samples: int = 0,
               temperature: float = 1.0, seed: int = 0, max_rollouts: int = 4096
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The shortest of each instance's `rollouts` and its length, ``((batch, n), (batch,))``,
    in evaluation mode. Instances go in chunks of at most ``max_rollouts`` tours (at least one
    instance), which bounds memory. The samples are a function of ``seed`` and the chunking."""
    check_inference_options(coords.shape[1], augment, starts, samples, temperature, max_rollouts)
    model.eval()
    chunk = max(1, max_rollouts // rollouts_per_instance(augment, starts, samples))
    generator = torch.Generator(device=coords.device).manual_seed(seed) if samples else None
    best = [shortest_tours(part, rollouts(model, part, augment, starts, samples, temperature, generator))
            for part in coords.split(chunk)]
    return torch.cat([tours for tours, _ in best]), torch.cat([lengths for _, lengths in best])


def multi_start_greedy(model: AttentionModel, coords: torch.Tensor, augment: int = 1, max_rollouts: int = 4096
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """POMO's inference (Kwon et al., NeurIPS 2020): a greedy tour from every city as the
    first, n tours per instance (8n with ``augment=8``), the shortest kept."""
    return best_tours(model, coords, augment=augment, starts=coords.shape[1], max_rollouts=max_rollouts)


def augmented_greedy(model: AttentionModel, coords: torch.Tensor, max_rollouts: int = 4096
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """POMO's ×8 augmentation alone: the model's greedy tour on each of the 8
    `symmetric_views` of an instance, the shortest kept."""
    return best_tours(model, coords, augment=8, max_rollouts=max_rollouts)


def sampled_best(model: AttentionModel, coords: torch.Tensor, samples: int, temperature: float = 1.0,
                 seed: int = 0, max_rollouts: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Kool et al.'s sampling: ``samples`` tours per instance drawn from the policy (its
    softmax at ``temperature``), the shortest kept (they report 1,280 samples)."""
    return best_tours(model, coords, samples=samples, temperature=temperature, seed=seed, max_rollouts=max_rollouts)


def timed_best_tours(model: AttentionModel, coords: torch.Tensor, augment: int = 1, starts: int = 0,
                     samples: int = 0, temperature: float = 1.0, seed: int = 0, max_rollouts: int = 4096
                     ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """`best_tours` and its wall-clock seconds. On a GPU the clock waits for the GPU's queue,
    and untimed first calls on a full chunk and on the last, shorter one compile and tune the
    kernels for their shapes (the timed call then reuses them)."""
    options = dict(augment=augment, starts=starts, samples=samples, temperature=temperature, seed=seed,
                   max_rollouts=max_rollouts)
    on_gpu = coords.device.type == "cuda"
    if on_gpu:
        chunk = max(1, max_rollouts // rollouts_per_instance(augment, starts, samples))
        for warm_up in {min(chunk, len(coords)), len(coords) % chunk} - {0}:
            best_tours(model, coords[:warm_up], **options)
        torch.cuda.synchronize(coords.device)
    start = time.perf_counter()
    tours, lengths = best_tours(model, coords, **options)
    if on_gpu:
        torch.cuda.synchronize(coords.device)
    return tours, lengths, time.perf_counter() - start


def plot_tour(ax, coords: torch.Tensor, tour: torch.Tensor, style: str = "-", label: str | None = None, **kwargs):
    """Draw one closed tour (``coords (n, 2)``, ``tour (n,)``) and its cities on ``ax``."""
    xy = coords.detach().cpu().numpy()
    path = xy[tour.tolist() + [tour[0].item()]]
    ax.plot(path[:, 0], path[:, 1], style, lw=kwargs.pop("lw", 1.3), label=label, **kwargs)
    ax.plot(xy[:, 0], xy[:, 1], "o", ms=3, color="k")
    ax.set(xlabel="x", ylabel="y", aspect="equal")


@dataclass
class ModelConfig(FieldsChecked):
    """The Attention Model's architecture, as train-tsp's options declare it (`flashlab.train.tsp_train.TSPConfig`
    takes these fields) and a tsp-model checkpoint is checked against on load."""

    d_model: int = option(128, "embedding width", low=1, on_resume="fixed")
    n_heads: int = option(8, "attention heads; must divide d_model", low=1, on_resume="fixed")
    n_layers: int = option(3, "encoder layers", low=1, on_resume="fixed")
    ff_dim: int = option(512, "feed-forward width", low=1, on_resume="fixed")
    tanh_clip: float = option(10.0, "logits are clipped to ±tanh_clip·tanh(·)", low=0, low_open=True,
                              on_resume="fixed")

    def check(self) -> None:
        check_fields(self)
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", f"{self.n_heads} does not divide d_model={self.d_model}; pick a divisor.")


# a tsp-model checkpoint's names for ModelConfig's fields (the AttentionModel's arguments)
_SAVED_NAMES = {"embed_dim": "d_model", "n_heads": "n_heads", "n_layers": "n_layers", "ff_dim": "ff_dim",
                "tanh_clip": "tanh_clip"}


def check_model_config(path, config) -> None:
    """Raise `flashlab.train.checkpoint.CheckpointError` unless ``config``, a tsp-model checkpoint's
    architecture (`save_model`), passes `ModelConfig`'s checks, the ones train-tsp applies to its options."""
    if not isinstance(config, dict):
        problem = f"a {type(config).__name__} where a dict of settings belongs"
    elif set(config) - set(_SAVED_NAMES):
        problem = f"{sorted(map(str, set(config) - set(_SAVED_NAMES)))[0]!r} is no setting of the Attention Model"
    elif set(_SAVED_NAMES) - set(config):
        problem = f"no {sorted(set(_SAVED_NAMES) - set(config))[0]}"
    else:
        problem = stored_problem(ModelConfig, {_SAVED_NAMES[k]: v for k, v in config.items()})
    if problem:
        raise checkpoint.CheckpointError(f"checkpoint: {path} holds a model architecture no model can have "
                                         f"({problem}); the file is damaged or was not written by flashlab.")


def model_field(name: str):
    """`ModelConfig`'s field ``name`` declared again (default, help, range, resume rule), for a config
    that holds the architecture with its other settings (`flashlab.train.tsp_train.TSPConfig`)."""
    f = next(f for f in dataclasses.fields(ModelConfig) if f.name == name)
    m = f.metadata
    return option(f.default, m["help"], choices=m["choices"], low=m["low"], high=m["high"], low_open=m["low_open"],
                  high_open=m["high_open"], on_resume=m["on_resume"])


def save_model(model: AttentionModel, path, **metadata) -> None:
    """A "tsp-model" checkpoint (`flashlab.train.checkpoint`): the weights, the architecture and
    free-form plain metadata (training time, …), written atomically."""
    config = {"embed_dim": model.init_embed.out_features, "n_heads": model.n_heads, "n_layers": len(model.layers),
              "ff_dim": model.layers[0].ff[0].out_features, "tanh_clip": model.tanh_clip}
    checkpoint.save(path, "tsp-model", config, {"model": model.state_dict()}, metadata)


def load_model(path, device="cpu", attention_fn=attention) -> tuple[AttentionModel, dict]:
    """The Attention Model of a "tsp-model" checkpoint, in evaluation mode, and its metadata.
    Reads tensors and plain data only (``weights_only=True``) and verifies the checksum;
    raises `flashlab.train.checkpoint.CheckpointError` for anything else."""
    saved = checkpoint.load(path, kind="tsp-model", map_location=device)
    check_model_config(path, saved.config)           # as train-tsp checks its options, then the weights
    model = AttentionModel(**saved.config, attention_fn=attention_fn).to(device)
    checkpoint.check_weights(path, "model", saved.state.get("model") if isinstance(saved.state, dict) else None, model)
    model.load_state_dict(saved.state["model"])
    return model.eval(), saved.metadata


def save_tours(path, seed: int, tours: torch.Tensor, lengths: torch.Tensor) -> None:
    """Write an evaluation's greedy tours (``(instances, n)``) and their lengths to a compressed
    ``.npz``, with the test seed the cities come from instead of the cities themselves: they are
    `random_instances(instances, n, seed)` again on any machine (drawn on the CPU's generator),
    and float32 coordinates would be most of the file (8 MB at 10,000 × 100 cities) and do not
    compress. Tours are stored in the smallest unsigned integer type that holds a city index."""
    import io

    import numpy as np

    from .checkpoint import write_atomically
    n = tours.shape[1]
    index_type = np.uint8 if n <= 256 else np.uint16 if n <= 65536 else np.int64
    data = io.BytesIO()                  # to this path exactly (given a name, numpy would add ".npz")
    np.savez_compressed(data, seed=np.uint64(seed), tours=tours.cpu().numpy().astype(index_type),
                        lengths=lengths.float().cpu().numpy())
    write_atomically(path, data.getvalue())   # a kill mid-write leaves the old file or the new one


def load_tours(path) -> dict:
    """What `save_tours` wrote, as NumPy arrays: ``{"coords", "tours" (int64), "lengths", "seed"}``,
    the cities drawn again from the seed. A file from before the seed was stored holds the
    cities themselves (``seed`` is then None). Raises ValueError if the saved lengths are not
    those of the tours over these cities (a wrong seed, a damaged file)."""
    import numpy as np
    with np.load(path) as saved:
        tours, lengths = saved["tours"].astype(np.int64), saved["lengths"]
        seed = int(saved["seed"]) if "seed" in saved.files else None
        coords = saved["coords"] if seed is None else random_instances(*tours.shape, seed).numpy()
    recomputed = tour_length(torch.from_numpy(coords), torch.from_numpy(tours)).numpy()
    if not np.allclose(recomputed, lengths, rtol=1e-5, atol=1e-5):
        raise ValueError(f"{path}: the saved lengths are not those of its tours over the cities of seed {seed}; "
                         f"largest difference {np.abs(recomputed - lengths).max():.3g}.")
    return {"coords": coords, "tours": tours, "lengths": lengths, "seed": seed}


def gap_percent(mean_length: float, n_nodes: int) -> float | None:
    """How far ``mean_length`` is above the published optimum mean for ``n_nodes`` cities, in
    percent; None for a size `PUBLISHED` does not list."""
    return 100 * (mean_length / PUBLISHED[n_nodes]["optimal"] - 1) if n_nodes in PUBLISHED else None


def describe_inference(augment: int = 1, starts: int = 0, samples: int = 0, temperature: float = 1.0,
                       seed: int = 0) -> str:
    """`best_tours`'s options in words: "multi-start ×20, ×8 augmentation (best of 160 tours per instance)"."""
    parts = [f"multi-start ×{starts}"] if starts else []
    if augment == 8:
        parts.append("×8 augmentation")
    if samples:
        at = f" at temperature {temperature:g}" if temperature != 1 else ""
        parts.append(f"{samples} samples{at} (seed {seed})")
    per_instance = rollouts_per_instance(augment, starts, samples)
    return f"{', '.join(parts) or 'greedy'} (best of {per_instance} tour{'s' * (per_instance > 1)} per instance)"


def evaluate(model: AttentionModel, n_nodes: int, instances: int, seed: int, device="cpu", batch_size: int = 1000):
    """Greedy tours of the model, and of both heuristics, on ``instances`` random instances
    drawn from ``seed``: ``{"coords", "tours", "lengths", "seconds" (the model's, wall-clock),
    "nearest_neighbour", "farthest_insertion"}``."""
    coords = random_instances(instances, n_nodes, seed, device)
    tours, lengths, seconds = timed_best_tours(model, coords, max_rollouts=batch_size)
    return {"coords": coords, "tours": tours, "lengths": lengths, "seconds": seconds,
            "nearest_neighbour": tour_length(coords, nearest_neighbour(coords)),
            "farthest_insertion": tour_length(coords, farthest_insertion(coords))}
