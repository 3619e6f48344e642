"""How a checkpoint stores its quantized Linear weights, from config.json's `quantization_config`.

One `Quantization` per checkpoint: the scheme (block or per-tensor fp8, int4 packed by
compressed-tensors, AWQ or GPTQ, NVFP4), its group size, and the modules it leaves unquantized.
`weight_bytes` counts one Linear weight of `rows` x `cols` (out x in) with every tensor the
checkpoint stores for it (the packed weight, its scales, zero points and shape), as vLLM 0.33.0
creates them (`model_executor/layers/quantization/`, named per scheme below); `quantizes` says
whether a module is one the checkpoint quantizes, by the matching rule of the scheme's config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatch
from math import ceil

from mlamem.spec.errors import UserError

# the schemes, by what `weight_bytes` stores for one Linear weight (out x in, `copies` checkpoint tensors):
# fp8-block   fp8 weight, fp32 weight_scale_inv per block (DeepSeek's own fp8; fp8.py, Fp8LinearMethod)
# fp8-tensor  fp8 weight, fp32 weight_scale (and input_scale when static) per tensor (fp8.py; modelopt.py
#             "FP8")
# fp8-channel fp8 weight, fp32 weight_scale per output row (compressed_tensors_w8a8_fp8.py, CHANNEL)
# int-pack    int32 weight_packed (32 // bits values each), weight_scale in the model's dtype per group,
#             weight_shape (two int32 in the checkpoint; vLLM holds them as int64), int32 packed
#             weight_zero_point when asymmetric (compressed_tensors_wNa16.py and
#             compressed_tensors_w4a8_fp8.py, create_weights)
# awq         int32 qweight (in, out // 8), int32 qzeros and fp16 scales per group (auto_awq.py)
# gptq        int32 qweight (in // 8, out), int32 qzeros and fp16 scales per group, int32 g_idx (auto_gptq.py)
# nvfp4       fp4 weight two to a byte, fp8 weight_scale per 16, fp32 weight_scale_2 and input_scale per
#             tensor (modelopt.py NVFP4; compressed_tensors_w4a4_nvfp4.py's global scales likewise)
# w4afp8      SGLang 0.5.23's (srt/layers/quantization/w4afp8.py, W4AFp8Config; vLLM 0.33.0 has none):
#             the routed experts int4 two to an int8, fp32 weight_scale_inv per 128 along the input,
#             a bf16 input_scale per tensor (W4AFp8MoEMethod.create_weights); every other Linear
#             block fp8 128 x 128 (Fp8LinearMethod)
SCHEMES = ("fp8-block", "fp8-tensor", "fp8-channel", "int-pack", "awq", "gptq", "nvfp4", "w4afp8")


@dataclass(frozen=True)
class Quantization:
    scheme: str
    label: str  # what the model's display name adds: "FP8", "INT4", "NVFP4", "W4A8", ...
    bits: int = 8  # bits per weight
    group: int = 0  # weights per scale along the input dimension; 0: one scale per row (int) or none
    block: tuple[int, int] | None = None  # fp8-block's (rows, cols) per scale
    symmetric: bool = True  # no zero points
    static_input: bool = False  # a per-tensor input scale is stored (static activations)
    ignore: tuple[str, ...] = ()  # the modules left unquantized, in the config's own notation
    match: str = "exact"  # how `ignore` matches: exact, regex (compressed-tensors), substring, wildcard
    targets: tuple[str, ...] = ()  # compressed-tensors' targets other than "Linear": only these quantize

    def quantizes(self, module: str) -> bool:
        """Whether the checkpoint quantizes the Linear `module` (its Hugging Face name)."""
        if self.targets and not any(_matches(module, target, "regex") for target in self.targets):
            return False
        return not any(_matches(module, pattern, self.match) for pattern in self.ignore)

    def weight_bytes(self, rows: int, cols: int, copies: int = 1, *, expert: bool = False) -> int:
        """The bytes the checkpoint stores for a quantized weight of `rows` x `cols` (out x in), which
        is `copies` tensors of rows // copies rows each (the routed experts, counted together)."""
        return sum(count * size for count, size in self.stored(rows, cols, copies, expert=expert))

    def weight_elements(self, rows: int, cols: int, copies: int = 1, *, expert: bool = False) -> int:
        """The elements of those tensors, what the Hub's parameter count adds up (two fp4 in one
        U8 element, eight int4 in one I32)."""
        return sum(count for count, _ in self.stored(rows, cols, copies, expert=expert))

    def stored(self, rows: int, cols: int, copies: int = 1, *,
               expert: bool = False) -> tuple[tuple[int, int], ...]:
        """The tensors stored for the weight, as (elements, bytes each), all copies together;
        `expert`: a routed expert's (w4afp8 stores those apart)."""
        out, per_tensor = rows // copies, ((copies, 4),) * (2 if self.static_input else 1)
        if self.scheme == "w4afp8" and expert:  # int8 weight, fp32 weight_scale_inv, bf16 input_scale
            return (rows * ceil(cols / 2), 1), (rows * ceil(cols / self.group), 4), (copies, 2)
        if self.scheme in ("fp8-block", "w4afp8"):
            return (rows * cols, 1), (self.block_scales(rows, cols), 4)
        if self.scheme == "fp8-tensor":
            return (rows * cols, 1), *per_tensor
        if self.scheme == "fp8-channel":
            return (rows * cols, 1), (rows, 4), *per_tensor[1:]
        if self.scheme == "nvfp4":  # weight, weight_scale, weight_scale_2 and input_scale
            return (rows * ceil(cols / 2), 1), (rows * ceil(cols / 16), 1), (2 * copies, 4)
        groups = cols // self.group if self.group else 1
        scales = (copies * groups * out, 2)
        if self.scheme == "awq":  # qweight (in, out / 8), qzeros, scales
            return (copies * cols * self._words(out), 4), (copies * groups * self._words(out), 4), scales
        if self.scheme == "gptq":  # qweight (in / 8, out), qzeros, scales, g_idx
            return ((copies * self._words(cols) * out, 4), (copies * groups * self._words(out), 4), scales,
                    (copies * cols, 4))
        zeros = () if self.symmetric else ((copies * self._words(out) * groups, 4),)
        return (copies * out * self._words(cols), 4), scales, (2 * copies, 4), *zeros

    def block_scales(self, rows: int, cols: int) -> int:
        """fp8-block's fp32 weight_scale_inv entries for a weight of `rows` x `cols`."""
        if self.block is None:
            return 0
        return ceil(rows / self.block[0]) * ceil(cols / self.block[1])

    def _words(self, values: int) -> int:
        """The int32 words that hold `values` packed, 32 // bits to a word."""
        return ceil(values * self.bits / 32)


def _matches(module: str, pattern: str, mode: str) -> bool:
    if mode == "substring":  # auto_awq.py get_quant_method: is_layer_skipped(match_mode="substring")
        return pattern in module
    if mode == "wildcard":  # modelopt.py is_layer_excluded: exact, substring, then fnmatch wildcards
        return pattern == module or pattern in module or fnmatch(module, pattern)
    if mode == "regex" and pattern.startswith("re:"):  # compressed-tensors' is_equal_or_regex_match
        return re.match(pattern[3:], module) is not None
    return module == pattern  # fp8.py: is_layer_skipped's exact match


def bad(name: str, text: str) -> UserError:
    """A quantization_config field's error, by its own name (`quantization_config.NAME ...`)."""
    name = f"quantization_config.{name}"
    return UserError(f"{name} {text}", field=f"config.{name}")


def parse_quantization(quant: object) -> Quantization | None:
    """config.json's `quantization_config` (None: a bf16 checkpoint), or one error naming the field.
    modelopt's hf_quant_config.json form, {"quantization": {...}}, reads the same."""
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise UserError(f"quantization_config needs a JSON object, got {quant!r}",
                        field="config.quantization_config")
    if isinstance(quant.get("quantization"), dict) and "quant_method" not in quant:
        quant = {"quant_method": "modelopt", **quant["quantization"]}
    method = quant.get("quant_method")
    readers = {"fp8": _fp8, "compressed-tensors": _compressed_tensors, "awq": _awq, "gptq": _gptq,
               "modelopt": _modelopt, "w4afp8": _w4afp8}
    if method not in readers:
        raise bad("quant_method", f"{method!r} is not modelled; mlamem reads {', '.join(readers)}")
    return readers[method](quant)


def _names(quant: dict, key: str, name: str = "") -> tuple[str, ...]:
    names = quant.get(key) or []
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise bad(name or key, f"needs a list of module names, got {names!r}")
    return tuple(names)


def _patterns(quant: dict, key: str, name: str = "") -> tuple[str, ...]:
    """compressed-tensors' module names, each exact or a regular expression after `re:`."""
    names = _names(quant, key, name)
    for pattern in names:
        try:
            re.compile(pattern[3:] if pattern.startswith("re:") else "")
        except re.error as error:
            raise bad(name or key, f"{pattern!r} is no regular expression ({error})") from None
    return names


def _int(quant: dict, key: str, *, allowed: tuple[int, ...] = ()) -> int:
    value = quant.get(key)
    wrong = value not in allowed if allowed else isinstance(value, int) and value < 1
    if isinstance(value, bool) or not isinstance(value, int) or wrong:
        wanted = f"one of {allowed}" if allowed else "a positive integer"
        raise bad(key, f"needs {wanted}, got {value!r}")
    return value


def _block(value: object, key: str) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in value)):
        raise bad(key, f"needs two positive integers, got {value!r}")
    return value[0], value[1]


def _fp8(quant: dict) -> Quantization:
    """vLLM 0.33.0 fp8.py Fp8Config.from_config: weight_block_size (block), else per tensor;
    ignored_layers or modules_to_not_convert, matched exactly."""
    ignore = _names(quant, "ignored_layers") or _names(quant, "modules_to_not_convert")
    static = quant.get("activation_scheme") == "static"
    block = quant.get("weight_block_size")
    if block is None:
        return Quantization("fp8-tensor", "FP8", static_input=static, ignore=ignore)
    return Quantization("fp8-block", "FP8", block=_block(block, "weight_block_size"), ignore=ignore)


def _w4afp8(quant: dict) -> Quantization:
    """SGLang 0.5.23 W4AFp8Config.from_config: the block is 128 x 128 and the group 128 whatever the
    config says, and no layer is ignored (it reads neither)."""
    return Quantization("w4afp8", "W4AFP8", bits=4, group=128, block=(128, 128))


def _group(quant: dict, key: str) -> int:
    """AWQ's and GPTQ's group size; -1 (channelwise: one group per row, 0 here) as vLLM 0.33.0
    serves it (quantization/utils/marlin_utils.py MARLIN_SUPPORTED_GROUP_SIZES)."""
    return 0 if quant.get(key) == -1 else _int(quant, key)


def _awq(quant: dict) -> Quantization:
    """auto_awq.py AWQConfig.from_config: w_bit or bits, q_group_size or group_size, zero_point."""
    bits = _int(quant, "w_bit" if "w_bit" in quant else "bits", allowed=(4, 8))
    group = _group(quant, "q_group_size" if "q_group_size" in quant else "group_size")
    return Quantization("awq", f"INT{bits} AWQ", bits=bits, group=group, symmetric=False,
                        ignore=_names(quant, "modules_to_not_convert"), match="substring")


def _gptq(quant: dict) -> Quantization:
    """auto_gptq.py GPTQConfig.from_config: bits, group_size (-1: one group per row)."""
    bits = _int(quant, "bits", allowed=(2, 3, 4, 8))
    group = _group(quant, "group_size")
    return Quantization("gptq", f"INT{bits} GPTQ", bits=bits, group=group, symmetric=bool(quant.get("sym")))


def _modelopt(quant: dict) -> Quantization:
    """modelopt.py ModelOptQuantConfigBase: quant_algo, group_size, exclude_modules (or ignore)
    matched as wildcards (is_layer_excluded)."""
    algo = str(quant.get("quant_algo", "")).upper()
    ignore = _names(quant, "ignore" if "ignore" in quant else "exclude_modules")
    schemes = {"FP8": ("fp8-tensor", "FP8"), "FP8_PER_CHANNEL_PER_TOKEN": ("fp8-channel", "FP8"),
               "NVFP4": ("nvfp4", "NVFP4")}
    if algo == "FP8_PB_WO":
        return Quantization("fp8-block", "FP8", block=(128, 128), ignore=ignore, match="wildcard")
    if algo not in schemes:
        raise bad("quant_algo", f"{algo!r} is not modelled; mlamem reads {', '.join(schemes)}, FP8_PB_WO")
    scheme, label = schemes[algo]
    fp4 = scheme == "nvfp4"
    return Quantization(scheme, label, bits=4 if fp4 else 8, group=16 if fp4 else 0,
                        static_input=scheme != "fp8-channel", ignore=ignore, match="wildcard")


def _compressed_tensors(quant: dict) -> Quantization:
    """compressed_tensors.py CompressedTensorsConfig.from_config: one config group's weights (and
    input_activations: W4A8 when they are 8 bits), its format, and `ignore` (exact, or `re:`)."""
    groups = quant.get("config_groups")
    if not (isinstance(groups, dict) and len(groups) == 1 and isinstance(next(iter(groups.values())), dict)):
        raise bad("config_groups", f"needs one config group (mlamem models one scheme a checkpoint), "
                  f"got {groups!r}")
    group = next(iter(groups.values()))
    weights, inputs = group.get("weights"), group.get("input_activations")
    if not isinstance(weights, dict):
        raise bad("config_groups.weights", f"needs a JSON object, got {weights!r}")
    form = group.get("format") or quant.get("format")
    targets = tuple(t for t in _patterns(group, "targets", "config_groups.targets") if t != "Linear")
    common = {"ignore": _patterns(quant, "ignore"), "targets": targets, "match": "regex"}
    bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
    if form == "nvfp4-pack-quantized":
        return Quantization("nvfp4", "NVFP4", bits=4, group=16, **common)
    if form == "pack-quantized" and kind == "int" and bits in (4, 8):
        size = 0 if strategy == "channel" else _int(weights, "group_size")
        acts = f"A{inputs['num_bits']}" if isinstance(inputs, dict) and inputs.get("num_bits") == 8 else ""
        return Quantization("int-pack", f"W{bits}{acts}" if acts else f"INT{bits}", bits=bits, group=size,
                            symmetric=weights.get("symmetric", True) is not False, **common)
    if form in ("float-quantized", "naive-quantized") and kind == "float" and bits == 8:
        static = isinstance(inputs, dict) and inputs.get("dynamic") is False
        if strategy == "block":
            block = _block(weights.get("block_structure"), "config_groups.weights.block_structure")
            return Quantization("fp8-block", "FP8", block=block, **common)
        if strategy in ("tensor", "channel"):
            return Quantization(f"fp8-{strategy}", "FP8", static_input=static, **common)
    keys = {"format": form, "weights.num_bits": bits, "weights.type": kind, "weights.strategy": strategy}
    given = ", ".join(f"{key} {value!r}" for key, value in keys.items() if value is not None)
    missing = ", ".join(key for key, value in keys.items() if value is None)
    said = "; ".join(part for part in (given, missing and f"no {missing}") if part)
    raise bad("format", f"and its config group ({said}): a scheme not modelled; mlamem reads "
              "pack-quantized int4/int8, float-quantized fp8 and nvfp4-pack-quantized")
