"""flashlab attention inside RL4CO, the routing library whose Attention Model (Kool et al.) is
notebook 09's capstone: its policies take any SDPA-like function as ``sdpa_fn``, used by the
encoder's self-attention and the decoder's masked glimpse. The same weights run with attention in
float64 (the reference), with SDPA in fp32 and with flashlab's kernels (Triton's interpreter
here): greedy tours, log-likelihoods and every parameter's gradient; then a few training steps of
RL4CO's own Lightning loop in bf16-mixed precision."""

import pytest
import torch
import torch.nn.functional as F

rl4co = pytest.importorskip("rl4co")

import flashlab  # noqa: E402
from flashlab.launch import interpreter_notice  # noqa: E402

NODES, BATCH = 12, 4
# fp32 attention against float64 attention, the rest of the policy fp32 in both: flashlab's error
# may be a few times SDPA's own (another summation order), and stays within TOL.
TOL = 1e-5


def _sdpa_float64(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=attn_mask,
                                         dropout_p=dropout_p, is_causal=is_causal)
    return out.to(q.dtype)


def _policies():
    """Three AttentionModelPolicy with the same weights, attention float64 / SDPA / flashlab."""
    from rl4co.models import AttentionModelPolicy
    made = {name: AttentionModelPolicy(env_name="tsp", embed_dim=64, num_heads=4, num_encoder_layers=2,
                                       sdpa_fn=fn)
            for name, fn in [("float64", _sdpa_float64), ("sdpa", F.scaled_dot_product_attention),
                             ("flashlab", flashlab.attention)]}
    for policy in made.values():
        policy.load_state_dict(made["float64"].state_dict())
    return made


def _rollout(policy, env, td):
    """A greedy tour per instance, its log-likelihood, and the gradients of REINFORCE's loss
    (advantage: the tour length's deviation from the batch mean, fixed)."""
    out = policy(td.clone(), env, phase="train", decode_type="greedy", return_actions=True)
    advantage = out["reward"] - out["reward"].mean()
    (-(advantage.detach() * out["log_likelihood"]).mean()).backward()
    grads = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
    return out["actions"], out["log_likelihood"].detach(), grads


def test_attention_model_policy_matches_float64_attention(monkeypatch):
    """Encoder self-attention and the decoder's masked glimpse (q one row, a bool mask of the
    visited cities) through flashlab's kernels: the same tours, log-likelihoods and gradients
    as with attention in float64."""
    from rl4co.envs import TSPEnv
    monkeypatch.setattr(interpreter_notice, "_interpreted_tiles", 0)
    env = TSPEnv(generator_params={"num_loc": NODES})
    td = env.reset(batch_size=[BATCH])
    results = {name: _rollout(policy, env, td) for name, policy in _policies().items()}
    assert interpreter_notice._interpreted_tiles > 0, "flashlab's kernels ran (in the interpreter)"
    ref_actions, ref_ll, ref_grads = results["float64"]
    for name in ("sdpa", "flashlab"):
        actions, ll, grads = results[name]
        assert torch.equal(actions, ref_actions), f"{name}: a different greedy tour"
    errors = {name: (flashlab.rel_error(ll, ref_ll), flashlab.rel_error(grads, ref_grads))
              for name, (_, ll, grads) in results.items()}
    for what, i in (("log-likelihood", 0), ("gradient", 1)):
        assert errors["flashlab"][i] <= max(TOL, 10 * errors["sdpa"][i]), (what, errors)


# Lightning's own notices about RL4CO's module (its hyperparameters keep nn.Modules; a deprecated pytree check)
@pytest.mark.filterwarnings("ignore:Attribute '(env|policy)' is an instance of:UserWarning")
@pytest.mark.filterwarnings("ignore:.isinstance.treespec, LeafSpec.. is deprecated:FutureWarning")
def test_rl4co_training_steps_in_bf16_mixed():
    """RL4CO's Lightning loop (AttentionModel, REINFORCE with an exponential baseline) on
    flashlab attention, precision "bf16-mixed" (autocast: flashlab takes bf16 inputs as SDPA
    would): two optimizer steps run, every parameter stays finite and the policy changes."""
    from rl4co.envs import TSPEnv
    from rl4co.models import AttentionModel, AttentionModelPolicy
    from rl4co.utils import RL4COTrainer
    env = TSPEnv(generator_params={"num_loc": NODES})
    policy = AttentionModelPolicy(env_name="tsp", embed_dim=32, num_heads=2, num_encoder_layers=1,
                                  sdpa_fn=flashlab.attention)
    before = [p.detach().clone() for p in policy.parameters()]
    model = AttentionModel(env, policy=policy, baseline="exponential", batch_size=BATCH, val_batch_size=BATCH,
                           train_data_size=2 * BATCH, val_data_size=BATCH, test_data_size=BATCH)
    # matmul_precision=None: RL4COTrainer's default "medium" would run this step's float32 matmuls in bf16 on a CPU
    # with bf16 units (conftest's float32_matmul_precision fixture restores the setting after every test)
    trainer = RL4COTrainer(max_epochs=1, accelerator="cpu", devices=1, precision="bf16-mixed", logger=False,
                           matmul_precision=None,
                           enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                           num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(model)
    assert trainer.global_step == 2
    after = list(policy.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a.detach(), b) for a, b in zip(after, before)), "the policy was trained"
