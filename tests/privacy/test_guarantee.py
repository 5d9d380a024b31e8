"""The guarantee statement: coverage of the outputs."""

import math

from privmtl.privacy.guarantee import PrivacyGuarantee


def _g(**kw):
    return PrivacyGuarantee(
        epsilon=1.0, delta=1e-5, relation="add-remove", sampling="poisson", accountant="rdp", **kw
    )


def test_covered_by_default_and_serialized():
    g = _g()
    assert g.covered
    d = g.to_dict()
    assert d["covered"] is True and d["not_covered"] == []
    assert "NOT COVERED" not in g.describe()


def test_not_covered_reasons_are_serialized_described_and_deduplicated():
    g = _g().with_not_covered("lambda chosen on pooled validation")
    g = g.with_not_covered("lambda chosen on pooled validation", "diagnostics")
    assert not g.covered
    assert g.not_covered == ("lambda chosen on pooled validation", "diagnostics")
    d = g.to_dict()
    assert d["covered"] is False and d["not_covered"] == list(g.not_covered)
    assert "NOT COVERED: lambda chosen on pooled validation; diagnostics" in g.describe()


def test_non_private_describes_coverage_and_noise_none():
    g = PrivacyGuarantee.non_private().with_not_covered("x")
    assert not math.isfinite(g.epsilon) and "NOT COVERED: x" in g.describe()
    assert "noise: none" in _g(noise_source="none").describe()
