"""The travelling salesman problem for the capstone: instances, tour lengths, two classic
construction heuristics, and the Attention Model of Kool, van Hoof and Welling (ICLR 2019)
with its attention running through `flashlab.attention`.

Instances are ``(batch, n, 2)`` coordinates, uniform in the unit square; a tour is a
``(batch, n)`` permutation of node indices, closed (the salesman returns to the start).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flashlab.api.attention import attention, attention_qkvpacked

from . import checkpoint
from .config import ConfigError, FieldsChecked, check_fields, option, stored_problem

# Kool et al. 2019, Table 1 (greedy decoding): optimal tour length and the AM's own result.
PUBLISHED = {20: {"optimal": 3.84, "am_greedy": 3.85}, 50: {"optimal": 5.70, "am_greedy": 5.80},
             100: {"optimal": 7.76, "am_greedy": 8.12}}


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

    def forward(self, coords: torch.Tensor, decode: str = "greedy", trace: list | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tours ``(batch, n)`` and the sum of their log-probabilities ``(batch,)``.
        ``decode``: "greedy" (most probable city each step) or "sample". ``trace``: a list
        that receives, step by step, the probability of every city ``(batch, n)`` (visited
        ones 0), to look inside the decoder."""
        if decode not in ("greedy", "sample"):
            raise ValueError(f"decode: {decode!r} is not 'greedy' or 'sample'.")
        batch, n, _ = coords.shape
        nodes = self.encode(coords)
        dim, heads = nodes.shape[-1], self.n_heads
        glimpse_k, glimpse_v, logit_k = self.project_nodes(nodes).chunk(3, dim=-1)
        split = lambda t: t.view(batch, n, heads, dim // heads).transpose(1, 2)    # (batch, heads, n, d)
        glimpse_k, glimpse_v = split(glimpse_k), split(glimpse_v)
        graph = self.project_graph(nodes.mean(1))
        rows = torch.arange(batch, device=coords.device)
        visited = torch.zeros(batch, n, dtype=torch.bool, device=coords.device)
        step_context = self.first_placeholder.expand(batch, -1)
        first = None
        tour, log_probs = [], []
        for _ in range(n):
            query = (graph + self.project_step(step_context)).view(batch, heads, 1, dim // heads)
            glimpse = masked_glimpse(query, glimpse_k, glimpse_v, visited, self.attention_fn)
            glimpse = self.project_out(glimpse.transpose(1, 2).reshape(batch, dim))
            log_p = pointer_log_probs(glimpse, logit_k, visited, self.tanh_clip)
            if trace is not None:
                trace.append(log_p.detach().exp())
            city = log_p.argmax(1) if decode == "greedy" else torch.multinomial(log_p.exp(), 1).squeeze(1)
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


def evaluate(model: AttentionModel, n_nodes: int, instances: int, seed: int, device="cpu", batch_size: int = 1000):
    """Greedy tours of the model, and of both heuristics, on ``instances`` random instances
    drawn from ``seed``: ``{"coords", "tours", "lengths", "nearest_neighbour", "farthest_insertion"}``."""
    coords = random_instances(instances, n_nodes, seed, device)
    tours = model.greedy_tours(coords, batch_size)
    return {"coords": coords, "tours": tours, "lengths": tour_length(coords, tours),
            "nearest_neighbour": tour_length(coords, nearest_neighbour(coords)),
            "farthest_insertion": tour_length(coords, farthest_insertion(coords))}
