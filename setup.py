"""The build backend's native part (the rest of the configuration is in pyproject.toml): the
extension's two modules (``secagg.ckks._seal_native`` and its public half
``secagg.ckks._seal_public``) are built by native/seal_build.py, through CMake over
SEAL 4.1.2, into every wheel, and the sdist carries SEAL's sources (native/SEAL) so that
installing it needs no download beyond the build requirements.

``SECAGG_NATIVE=off`` builds secagg without the extension (then the ``threshold`` backend is
unavailable and ``ckks`` runs on TenSEAL's binding alone); scripts/setup.sh sets it for the
editable install and builds the extension in place right after (scripts/build_native.sh).
"""

import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

sys.path.insert(0, str(Path(__file__).resolve().parent / "native"))
import seal_build  # noqa: E402


def _skip() -> bool:
    return os.environ.get("SECAGG_NATIVE", "auto").strip().lower() == "off"


class BuildSealNative(build_ext):
    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        name = ext.name.rsplit(".", 1)[1]
        in_place = seal_build.in_place_target(name)
        try:
            if seal_build.current(in_place):
                # a checkout's in-place build from exactly these sources and this interpreter
                # (scripts/build_native.sh's stamp): the wheel takes it as it is
                seal_build.log(f"reusing the current build {in_place}")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(in_place, target)
            else:
                seal_build.build({name: target}, Path(self.build_temp).resolve() / "seal_native")
        except seal_build.BuildError as exc:
            sys.exit(f"secagg native: {exc}\n(SECAGG_NATIVE=off builds secagg without it)")


class SdistWithSeal(sdist):
    """The sdist carries SEAL's sources (from the pinned Pyfhel sdist) as native/SEAL."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        seal_build.extract_seal(seal_build.pyfhel_sdist(), Path(base_dir) / "native" / "SEAL")


if _skip():
    seal_build.log("SECAGG_NATIVE=off: building secagg without the extension")
setup(
    ext_modules=[]
    if _skip()
    else [Extension(f"secagg.ckks.{name}", sources=[]) for name in seal_build.NAMES],
    cmdclass={"build_ext": BuildSealNative, "sdist": SdistWithSeal},
)
