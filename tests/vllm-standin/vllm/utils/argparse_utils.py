"""FlexibleArgumentParser: vLLM's argparse subclass, the parts the serve CLI relies on.

As in vLLM: option names accept underscores for dashes (``--max_model_len``),
``-O3`` / ``-O 3`` mean ``--optimization-level 3``, ``BooleanOptionalAction`` flags
named ``--enable-x`` also answer to ``--disable-x`` (and ``--no-enable-x``), and
unique prefixes of long options are accepted (argparse's ``allow_abbrev``).

Unlike vLLM: ``--config`` (a YAML file) is refused, and arguments the stand-in does
not know are accepted with a warning (vLLM exits 2 on them); they are kept in
``args._standin_ignored``.
"""

import argparse
import re
import sys
from argparse import BooleanOptionalAction

from vllm.logger import init_logger

logger = init_logger(__name__)


def human_readable_int(value: str) -> int:
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * binary[suffix]
        except ValueError as error:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}."
            ) from error
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


class EnableDisableAction(BooleanOptionalAction):
    """``--enable-x`` / ``--disable-x`` (and the hidden ``--no-enable-x``)."""

    _inverse_prefixes = {"--enable-": "--disable-", "--disable-": "--enable-"}

    def __init__(self, option_strings, dest, *args, **kwargs):
        super().__init__(option_strings, dest, *args, **kwargs)
        inverses = [
            inverse + opt.removeprefix(prefix)
            for opt in option_strings
            for prefix, inverse in self._inverse_prefixes.items()
            if opt.startswith(prefix)
        ]
        negated = {opt for opt in self.option_strings if opt not in option_strings}
        self.negative_option_strings = negated | set(inverses)
        self.option_strings = [*self.option_strings, *inverses]

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string not in self.negative_option_strings)


class FlexibleArgumentParser(argparse.ArgumentParser):
    """ArgumentParser that allows both underscore and dash in names."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        kwargs.pop("add_json_tip", None)
        super().__init__(*args, **kwargs)
        self.register("action", BooleanOptionalAction, EnableDisableAction)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        if args is None:
            args = sys.argv[1:]
        args = list(args)
        if any(a == "--config" or a.startswith("--config=") for a in args):
            self.error("--config (a YAML file of options) is not supported by the vsnap stand-in")
        pattern = re.compile(r"(?<=--)[^\.]*")
        processed: list[str] = []
        for i, arg in enumerate(args):
            if arg.startswith("--"):
                if "=" in arg:
                    key, value = arg.split("=", 1)
                    key = pattern.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
                    processed.append(f"{key}={value}")
                else:
                    processed.append(
                        pattern.sub(lambda m: m.group(0).replace("_", "-"), arg, count=1)
                    )
            elif arg.startswith("-O") and arg != "-O":
                level = arg[3:] if arg[2] == "=" else arg[2:]
                processed += ["--optimization-level", level]
            elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
                processed.append("--optimization-level")
            else:
                processed.append(arg)
        namespace, extras = self.parse_known_args(processed, namespace)
        if extras:
            logger.warning(
                "vsnap stand-in: ignoring arguments it does not know "
                "(vLLM would check them): %s",
                " ".join(extras),
            )
        namespace._standin_ignored = extras
        return namespace
