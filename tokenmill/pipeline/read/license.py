"""License gate: source licenses against the datamix allow-list, and per-document licenses.

Source level: every source's license (dataset card or datamix override) must be in
``licenses.allow`` or the run refuses to start, naming the source and license.

Document level (``document_license: cc-attributes``): Dolma-format web documents carry
one attribute per detected Creative Commons license, named like
``cc_re__cc_re__cc_by_nc_sa_4_0`` (Dolma's cc_re tagger). It is read as the license id
``cc-by-nc-sa-4.0``; a document is rejected when any of its licenses contains a denied
term (default: ``nc`` non-commercial, ``nd`` no-derivatives) or when it has none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.stage import Document, DocumentStage

_CC_PREFIX = re.compile(r"^(?:cc_re__)+")


class LicenseError(ValueError):
    """A source's license is unknown or not allowed; raised before any work starts."""


def check_source_licenses(cfg: DatamixConfig, sources: Iterable) -> None:
    """Raise :class:`LicenseError` listing every source whose license is not allowed.

    A source with per-document licenses is exempt at source level (its documents are
    gated one by one).
    """
    allow = {a.lower() for a in cfg.licenses.allow}
    bad = [f"source {s.name!r} has license {s.license!r}" for s in sources
           if not s.per_document_license and s.license not in allow]
    if bad:
        raise LicenseError("license not in the datamix allow-list "
                           f"({', '.join(sorted(allow))}): " + "; ".join(bad))


def cc_attribute_license(attribute: str) -> str:
    """``cc_re__cc_re__cc_by_nc_sa_4_0`` → ``cc-by-nc-sa-4.0`` (``..._3_0_it`` → ``-3.0-it``)."""
    name = _CC_PREFIX.sub("", attribute)
    name = re.sub(r"_(\d+)_(\d+)(?=_|$)", r"_\1.\2", name)
    return name.replace("_", "-")


def document_licenses(attributes: dict | None) -> list[str]:
    """Sorted per-document license ids from a Dolma ``attributes`` dict."""
    if not attributes:
        return []
    return sorted({cc_attribute_license(k) for k in attributes if k.startswith("cc_")})


class DocumentLicenseGate(DocumentStage):
    """Reject documents whose per-document license has a denied term.

    Reads ``doc.metadata["attributes"]`` (Dolma schema). Sets
    ``doc.metadata["license"]`` on kept documents. Rejection reasons:
    ``license:<id>`` (denied) and ``license:none`` (no license attribute).
    """

    name = "license"

    def __init__(self, deny_terms: list[str]) -> None:
        super().__init__(deny_terms=sorted(deny_terms))
        self.deny = set(deny_terms)

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            lics = document_licenses(doc.metadata.pop("attributes", None))
            if not lics:
                self.reject(doc, "license:none")
                continue
            denied = [lic for lic in lics if self.deny & set(lic.split("-"))]
            if denied:
                self.reject(doc, f"license:{denied[0]}")
                continue
            lic = "+".join(lics)
            self.extra[lic] += 1  # accepted documents per license
            doc.metadata["license"] = lic
            yield doc
