import dp_accounting
import numpy as np
import pytest
import torch

from privmtl.federated.reference import aggregate_reference
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import SeededNoise, seeded_torch_generator
from privmtl.privacy.release import GaussianMeanRelease
from privmtl.privacy.sampling import make_sampler


def _updates(k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn((k, 3, 2), generator=g, dtype=torch.float64),
        "b": torch.randn((k, 3), generator=g, dtype=torch.float64),
    }


def test_noise_multiplier_and_event_are_the_samplers():
    rel = GaussianMeanRelease(clip=0.5, noise_std=0.02, sampler=make_sampler("poisson", 100, 20))
    assert rel.noise_multiplier == pytest.approx(0.02 * 20 / 0.5)
    assert rel.event() == dp_accounting.PoissonSampledDpEvent(
        0.2, dp_accounting.GaussianDpEvent(0.8)
    )
    assert GaussianMeanRelease(clip=None, noise_std=1.0, sampler=rel.sampler).event() is None


def test_release_is_the_clipped_mean_over_fixed_q_plus_the_seeded_noise():
    upd = _updates(4)
    sampler = make_sampler("fixed", 10, 5)
    rel = GaussianMeanRelease(clip=1.0, noise_std=0.3, sampler=sampler)
    out = rel.release(upd, SeededNoise(3))
    ref_mean, ref_norms, ref_clipped = aggregate_reference(
        [{n: t[j] for n, t in upd.items()} for j in range(4)],
        {n: t[0] for n, t in upd.items()},
        1.0,
        5,
    )
    gen = seeded_torch_generator(3)
    for n in upd:
        noise = torch.randn(upd[n].shape[1:], generator=gen, dtype=torch.float64) * 0.3
        torch.testing.assert_close(out.value[n], ref_mean[n] + noise)
    np.testing.assert_allclose(out.norms, ref_norms)
    assert out.clipped.tolist() == ref_clipped.tolist()


def test_the_release_is_recorded_before_it_is_returned(tmp_path):
    sampler = make_sampler("poisson", 10, 5)
    rel = GaussianMeanRelease(clip=1.0, noise_std=0.3, sampler=sampler)

    class Exploding(PrivacyLedger):
        def record(self, *a, **k):
            raise OSError("disk full")

    with pytest.raises(OSError):
        rel.release(_updates(2), SeededNoise(0), ledger=Exploding(delta=1e-3))
    ledger = PrivacyLedger(delta=1e-3, path=tmp_path / "l.jsonl")
    out = rel.release(_updates(2), SeededNoise(0), ledger=ledger, round=0, release_id="round:0")
    assert ledger.records[0]["mechanism"] == "gaussian-mean"
    assert ledger.records[0]["params"]["noise_multiplier"] == pytest.approx(1.5)
    assert out.epsilon == pytest.approx(ledger.epsilon())


def test_block_release_puts_each_clipped_message_in_its_block_and_noises_all():
    upd = _updates(2, seed=1)
    rel = GaussianMeanRelease(
        clip=0.5, noise_std=0.0, sampler=make_sampler("all", 4, 4), divisor=1.0
    )
    out = rel.release_blocks(upd, np.array([1, 3]), 4, SeededNoise(0))
    norms = torch.sqrt(sum(t.flatten(1).pow(2).sum(1) for t in upd.values()))
    for n, t in upd.items():
        assert torch.all(out.value[n][[0, 2]] == 0)
        expected = t * (0.5 / norms).clamp(max=1).view((-1,) + (1,) * (t.ndim - 1))
        torch.testing.assert_close(out.value[n][[1, 3]], expected)
    noisy = GaussianMeanRelease(clip=0.5, noise_std=1.0, sampler=rel.sampler, divisor=1.0)
    out2 = noisy.release_blocks(upd, np.array([1, 3]), 4, SeededNoise(0))
    assert torch.all(out2.value["w"][[0, 2]] != 0)


def test_signal_and_noise_norms_are_those_of_the_clipped_mean_and_of_the_draws():
    upd = _updates(4, seed=5)
    rel = GaussianMeanRelease(clip=1.0, noise_std=0.3, sampler=make_sampler("fixed", 10, 5))
    out = rel.release(upd, SeededNoise(3))
    mean = rel.release(upd, SeededNoise(3)).value  # same seed: same noise
    clean = GaussianMeanRelease(clip=1.0, noise_std=0.0, sampler=rel.sampler).release(
        upd, SeededNoise(3)
    )
    flat = torch.cat([clean.value[n].flatten() for n in upd])
    noise = torch.cat([(mean[n] - clean.value[n]).flatten() for n in upd])
    assert out.details["signal_norm"] == pytest.approx(float(flat.norm()))
    assert out.details["noise_norm"] == pytest.approx(float(noise.norm()))
    assert out.details["released_dim"] == 3 * 2 + 3
    assert clean.details["noise_norm"] == 0.0


def test_release_from_a_clipped_sum_is_the_release_of_the_messages(tmp_path):
    # client-side clipping (secure aggregation): the curator gets only the sum of clipped
    # messages; the released value, the noise and the ledger entry are those of release()
    upd = _updates(4, seed=5)
    sampler = make_sampler("poisson", 10, 5)
    rel = GaussianMeanRelease(clip=1.0, noise_std=0.3, sampler=sampler)
    from privmtl.privacy.release import clip_factors, update_norms

    fac = clip_factors(update_norms(upd), 1.0)
    total = {n: torch.tensordot(fac.to(t.dtype), t, dims=1) for n, t in upd.items()}
    la = PrivacyLedger(delta=1e-3, path=tmp_path / "a.jsonl")
    lb = PrivacyLedger(delta=1e-3, path=tmp_path / "b.jsonl")
    a = rel.release(upd, SeededNoise(7), ledger=la, round=0, release_id="round:0")
    b = rel.release_sum(total, SeededNoise(7), ledger=lb, round=0, release_id="round:0")
    for n in upd:
        torch.testing.assert_close(a.value[n], b.value[n])
    assert la.records == lb.records and b.epsilon == a.epsilon
    assert b.norms.size == 0 and b.clipped.size == 0
    assert b.details["signal_norm"] == pytest.approx(a.details["signal_norm"])
    assert b.details["noise_norm"] == pytest.approx(a.details["noise_norm"])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_diverged_message_counts_as_zero_and_the_release_stays_finite(bad):
    """A client whose training diverged sends nothing: the release equals that of the others
    over the same fixed q (its contribution is 0, within the clip), not NaN."""
    upd = _updates(4)
    broken = {n: t.clone() for n, t in upd.items()}
    broken["w"][2, 0, 0] = bad
    zeroed = {n: t.clone() for n, t in upd.items()}
    for t in zeroed.values():
        t[2] = 0.0
    rel = GaussianMeanRelease(clip=1.0, noise_std=0.3, sampler=make_sampler("fixed", 10, 5))
    out = rel.release(broken, SeededNoise(3))
    ref = rel.release(zeroed, SeededNoise(3))
    for n in upd:
        assert bool(torch.isfinite(out.value[n]).all())
        torch.testing.assert_close(out.value[n], ref.value[n])
    assert not np.isfinite(out.norms[2]) and out.clipped[2]
