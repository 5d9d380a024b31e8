"""Models of the PMTL experiments: multinomial logistic regression and the FEMNIST CNN.

Any ``torch.nn.Module`` mapping a float batch ``(B, d)`` to logits ``(B, C)`` works with the
training engine, which calls it functionally (:func:`torch.func.functional_call`) with stacked
per-client parameters under :func:`torch.func.vmap`. Requirements for the batched engine: no
in-place buffer updates in the forward pass (use GroupNorm/LayerNorm instead of BatchNorm) and no
data-dependent Python control flow. Both models below accept flat inputs and reshape them
themselves.

A model may also define ``forward_batched(params, x)``: ``params`` maps every parameter name to a
stacked tensor ``(K, *shape)`` (one slice per client), ``x`` is ``(K, B, ...)`` and the result the
logits ``(K, B, C)``, client ``k``'s logits depending on client ``k``'s parameters and inputs only.
The engine then differentiates the sum of the per-client losses with ordinary autograd instead of
``vmap(grad(...))``. Both models below implement it with batched matrix products and, for the CNN,
one grouped convolution over all clients in channels-last layout (what ``vmap``'s batching rule
does in NCHW; channels-last is 15-25% faster on CPU).

Layout matters for reproducibility, not only speed: the grouped channels-last convolution rounds
exactly like a per-client channels-last convolution but differently (~1e-7) from an NCHW one, and
max-pooling turns such differences into a different argmax when two activations of a window are
nearly equal, i.e. a different (equally valid) gradient; float32 runs then drift apart (~1e-2
after 5 rounds). :meth:`FemnistCNN.forward` therefore runs its second convolution in channels-last
too, except under ``torch.func`` transforms, which cannot change the layout (``vectorize="vmap"``);
that path equals the reference loop exactly only up to such argmax flips (checked in float64).

Initialisation uses an explicit ``torch.Generator`` seeded by ``random_state`` so that the same seed
always gives the same initial model (every client starts from it, ``w_k^0 = w~^0``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from privmtl._validation import check_choice, check_int
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.user_model import is_factory_spec, load_factory

if TYPE_CHECKING:
    from privmtl.data.federated import FederatedDataset
    from privmtl.federated.user_model import UserFactory

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "FemnistCNN",
    "MultinomialLogReg",
    "count_parameters",
    "make_model",
]

MODELS = ("cnn", "logreg")
DEFAULT_MODEL = "logreg"
"""The model of a run when none is given (``privmtl pmtl``, ``run_pmtl``, the sweep, Flower)."""
"""The built-in models of a run (``--model``); a user's is ``MODULE:FACTORY`` or ``PATH.py:FACTORY``."""


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters of ``model`` (the dimension of one client's ``w_k``)."""
    return sum(p.numel() for p in model.parameters())


def _seed_generator(random_state: int | None) -> torch.Generator | None:
    if random_state is None:
        return None
    return torch.Generator().manual_seed(check_int("random_state", random_state, low=0))


def _init_like_pytorch(layer: nn.Linear | nn.Conv2d, gen: torch.Generator | None) -> None:
    """PyTorch's default init (kaiming-uniform a=sqrt(5), uniform bias), from ``gen``."""
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=gen)
    if layer.bias is not None:
        fan_in = layer.weight[0].numel()
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        nn.init.uniform_(layer.bias, -bound, bound, generator=gen)


class MultinomialLogReg(nn.Module):
    """Multinomial logistic regression: logits ``W x + b`` with ``W`` ``(C, d)``, ``b`` ``(C,)``.

    Trained with the mean cross-entropy ``-(1/n) sum_i log softmax(W x_i + b)_{y_i}`` (the model
    of the paper's StackOverflow experiment). Inputs of any shape ``(B, ...)`` are flattened to
    ``(B, d)``.

    Parameters
    ----------
    n_features : int
        Input dimension ``d``.
    n_classes : int
        Number of classes ``C`` (>= 2).
    zero_init : bool, default True
        Start from ``W = 0, b = 0`` (the problem is convex); ``False`` uses PyTorch's default
        uniform initialisation drawn from ``random_state``.
    random_state : int or None, default 0
        Seed of the initialisation when ``zero_init`` is False.
    """

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        *,
        zero_init: bool = True,
        random_state: int | None = 0,
    ) -> None:
        super().__init__()
        self.n_features = check_int("n_features", n_features, low=1)
        self.n_classes = check_int("n_classes", n_classes, low=2)
        self.linear = nn.Linear(self.n_features, self.n_classes)
        with torch.no_grad():
            if zero_init:
                self.linear.weight.zero_()
                self.linear.bias.zero_()
            else:
                _init_like_pytorch(self.linear, _seed_generator(random_state))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.reshape(x.shape[0], self.n_features))

    def forward_batched(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Logits ``(K, B, C)`` of ``K`` clients' models (stacked ``params``) on ``x (K, B, ...)``."""
        k, b = x.shape[:2]
        w, bias = params["linear.weight"], params["linear.bias"]
        return torch.baddbmm(bias.unsqueeze(1), x.reshape(k, b, self.n_features), w.transpose(1, 2))


class FemnistCNN(nn.Module):
    """The 4-layer FEMNIST CNN (two conv/ReLU/max-pool blocks, then a classifier).

    ``variant="pmtl"`` (default) is the network of the PMTL authors' released code
    (``models/femnist/erm_cnn_log_reg.py`` of github.com/s-huu/PMTL), i.e. what produced the
    paper's FEMNIST numbers, and matches the SPEC's "fc 1024 → 62"::

        28×28×1 → conv 5×5, 32, no padding → ReLU → maxpool 2 → 12×12×32
                → conv 5×5, 64, no padding → ReLU → maxpool 2 → 4×4×64 = 1024
                → linear 1024 → 62                       (115 646 parameters)

    ``variant="leaf"`` is LEAF's reference FEMNIST CNN (Caldas et al. 2018), with "same" padding
    and a hidden dense layer::

        conv 5×5, 32, pad 2 → ReLU → maxpool 2 → conv 5×5, 64, pad 2 → ReLU → maxpool 2 → 3136
                → linear 3136 → 2048 → ReLU → linear 2048 → 62   (6 603 710 parameters)

    The LEAF variant is 57× larger; with persistent personalized models the engine stores
    ``m × 6.6 M`` floats (2.8 GB for 105 clients), so the PMTL variant is the default.

    Parameters
    ----------
    n_classes : int, default 62
    variant : {"pmtl", "leaf"}, default "pmtl"
    random_state : int or None, default 0
        Seed of PyTorch's default (kaiming-uniform) initialisation; ``None`` uses the global RNG.

    Notes
    -----
    Inputs are ``(B, 784)`` flattened row by row (as LEAF stores them) or ``(B, 1, 28, 28)``.
    """

    def __init__(
        self, n_classes: int = 62, *, variant: str = "pmtl", random_state: int | None = 0
    ) -> None:
        super().__init__()
        self.n_classes = check_int("n_classes", n_classes, low=2)
        self.variant = check_choice("variant", variant, ("pmtl", "leaf"))
        pad = 0 if variant == "pmtl" else 2
        self.conv1 = nn.Conv2d(1, 32, kernel_size=5, padding=pad)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=pad)
        self.pool = nn.MaxPool2d(2, 2)
        if variant == "pmtl":
            self.classifier: nn.Module = nn.Linear(4 * 4 * 64, self.n_classes)
        else:
            self.classifier = nn.Sequential(
                nn.Linear(7 * 7 * 64, 2048), nn.ReLU(), nn.Linear(2048, self.n_classes)
            )
        gen = _seed_generator(random_state)
        with torch.no_grad():
            for mod in self.modules():
                if isinstance(mod, nn.Linear | nn.Conv2d):
                    _init_like_pytorch(mod, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # ReLU and max-pooling commute (relu(max(a, b)) = max(relu(a), relu(b)), with the same
        # gradient): pooling first applies the ReLU to 4x fewer activations.
        h = torch.relu(self.pool(self.conv1(x.reshape(-1, 1, 28, 28))))
        if not torch._C._functorch.is_functorch_wrapped_tensor(h):  # vmap cannot re-layout
            h = h.contiguous(memory_format=torch.channels_last)  # as in forward_batched
        h = torch.relu(self.pool(self.conv2(h)))
        return self.classifier(h.flatten(1))  # type: ignore[no-any-return]

    def forward_batched(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Logits ``(K, B, C)`` of ``K`` clients' CNNs (stacked ``params``) on ``x (K, B, 784)``.

        The clients become the channel groups of one grouped convolution: the input is laid out
        as ``(B, K, 28, 28)`` in channels-last memory format and the weights as
        ``(K * C_out, C_in, 5, 5)`` with ``groups=K``; the dense layers are batched matrix
        products. Same function as :meth:`forward` for each client.
        """
        k, b = x.shape[:2]
        pad = self.conv1.padding
        h = x.reshape(k, b, 28, 28).transpose(0, 1).contiguous(memory_format=torch.channels_last)
        w1, w2 = params["conv1.weight"], params["conv2.weight"]
        h = F.conv2d(
            h,
            w1.reshape(-1, *w1.shape[2:]),
            params["conv1.bias"].reshape(-1),
            padding=pad,
            groups=k,
        )
        h = torch.relu(F.max_pool2d(h, 2)).contiguous(memory_format=torch.channels_last)
        h = F.conv2d(
            h,
            w2.reshape(-1, *w2.shape[2:]),
            params["conv2.bias"].reshape(-1),
            padding=pad,
            groups=k,
        )
        h = torch.relu(F.max_pool2d(h, 2))  # (B, K * 64, s, s)
        h = h.reshape(b, k, -1).transpose(0, 1)  # (K, B, 64 * s * s), per-client NCHW order
        if self.variant == "pmtl":
            return _bmm_linear(h, params["classifier.weight"], params["classifier.bias"])
        h = torch.relu(_bmm_linear(h, params["classifier.0.weight"], params["classifier.0.bias"]))
        return _bmm_linear(h, params["classifier.2.weight"], params["classifier.2.bias"])


def _bmm_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Per-client affine map: ``h (K, B, i)``, ``weight (K, o, i)``, ``bias (K, o)``."""
    return torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))


def make_model(
    name: str,
    dataset: FederatedDataset,
    seed: int,
    factory: UserFactory | None = None,
) -> torch.nn.Module:
    """``cnn`` (the paper's FEMNIST CNN; needs 1×28×28 inputs), ``logreg`` (multinomial), or a
    user's model ``"MODULE:FACTORY"`` / ``"PATH.py:FACTORY"``
    (:func:`~privmtl.federated.user_model.load_factory`; ``factory``: one already loaded).

    The factory is called as ``factory(n_features, n_classes)`` (with torch's global seed set to
    ``seed``) and must return a :class:`torch.nn.Module` mapping ``(batch, n_features)`` float
    inputs to ``(batch, n_classes)`` logits; one dummy forward pass checks it before training.
    """
    torch.manual_seed(seed)
    if factory is not None or is_factory_spec(name):
        user = factory if factory is not None else load_factory(name)
        return user.build(dataset.n_features, dataset.n_classes)
    check_choice("model", name, MODELS)
    if name == "cnn":
        if tuple(dataset.feature_shape) != (1, 28, 28):
            raise InvalidParameterError(
                "The 'model' parameter 'cnn' needs 28x28 images (FEMNIST); got features of shape "
                f"{tuple(dataset.feature_shape)}. Use --model logreg."
            )
        return FemnistCNN(n_classes=dataset.n_classes, random_state=seed)
    return MultinomialLogReg(dataset.n_features, dataset.n_classes, random_state=seed)
