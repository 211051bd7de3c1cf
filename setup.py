"""Packaging for newtonipc_nb: every field comes from settings.ini, the project's one config."""
from configparser import ConfigParser
import shlex
import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read("settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

requirements = shlex.split(cfg.get("requirements", ""))
dev_requirements = shlex.split(cfg.get("dev_requirements", ""))
# OpenUSD for the Newton examples that read .usd assets (cloth_twist, cloth_bending): an extra, not a core need
usd_requirements = shlex.split(cfg.get("usd_requirements", ""))
console_scripts = cfg.get("console_scripts", "").split()
licenses = {"apache2": "Apache-2.0"}
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable"]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    url=cfg["git_url"],
    license=licenses[cfg["license"]],
    keywords=cfg["keywords"],
    classifiers=[
        "Development Status :: " + statuses[int(cfg["status"])],
        "Intended Audience :: " + cfg["audience"],
        "Natural Language :: " + cfg["language"],
        "Programming Language :: Python :: 3.11",
    ],
    packages=setuptools.find_packages(include=[cfg["lib_name"], cfg["lib_name"] + ".*"]),
    include_package_data=True,
    python_requires=">=" + cfg["min_python"],
    install_requires=requirements,
    extras_require={"dev": dev_requirements + usd_requirements, "usd": usd_requirements},
    entry_points={
        "console_scripts": console_scripts,
        "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
    },
    zip_safe=False,
)
