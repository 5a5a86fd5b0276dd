"""Which packages the llmbus distribution installs, and from which folders (the rest is in pyproject.toml).

The services live in the top-level folder `services/` but install as `llmbus_services`, a name that
cannot collide with another project's `services` in a user's environment. pyproject.toml's
`packages.find` names a package after its folder, so the mapping is written here.
"""

from setuptools import find_namespace_packages, setup

SERVICES_IMPORT_NAME = "llmbus_services"
SERVICES_FOLDER = "services"

# Namespace packages too: the folders of YAML and data files (policies/, data/) ship as package data.
NOT_PACKAGES = ["*__pycache__*"]
packages = [
    *find_namespace_packages("libs/common", include=["llmbus", "llmbus.*"], exclude=NOT_PACKAGES),
    *find_namespace_packages(".", include=["llmbus_tools", "llmbus_tools.*"], exclude=NOT_PACKAGES),
    SERVICES_IMPORT_NAME,
    *(f"{SERVICES_IMPORT_NAME}.{name}" for name in find_namespace_packages(SERVICES_FOLDER, exclude=NOT_PACKAGES)),
]

setup(
    packages=packages,
    package_dir={"llmbus": "libs/common/llmbus", SERVICES_IMPORT_NAME: SERVICES_FOLDER},
)
