"""STARE: its config (:mod:`.config`), the NumPy and torch math (:mod:`.core`, :mod:`.core_torch`, the compiled
:mod:`.kernels`), the gate/schedule controller (:mod:`.controller`), one reweighting step (:mod:`.reweight`) and
the method with its verl estimator (:mod:`.method`)."""

from stare_verl.methods.stare.method import Stare, compute_stare_advantage

__all__ = ["Stare", "compute_stare_advantage"]
