"""stare-verl: STARE (Surprisal-guided Token-level Advantage Reweighting for policy Entropy stability) for verl.

The algorithm (``stare_verl.core``, ``stare_verl.controller``) is pure PyTorch; the verl wiring
(``stare_verl.estimator``, ``stare_verl.trainer``, ``stare_verl.plugin``) is a thin adapter loaded
through verl's ``verl.plugins`` entry point, so ``algorithm.adv_estimator=stare`` works in every process.
"""

__version__ = "0.1.0"
