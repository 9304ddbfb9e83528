"""stare-verl: STARE (Surprisal-guided Token-level Advantage Reweighting for policy Entropy stability) for verl.

The entropy-control methods (``stare_verl.methods``: STARE in ``stare_verl.methods.stare``, on the GRPO group
baseline of ``stare_verl.methods.group_baseline``) are pure PyTorch/NumPy; the verl wiring (``stare_verl.trainer``,
``stare_verl.plugin``, ``stare_verl.verl_compat``) is a thin adapter loaded through verl's ``verl.plugins`` entry
point, so ``algorithm.adv_estimator=stare`` works in every process.
"""

__version__ = "0.1.0"
