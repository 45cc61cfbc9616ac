"""The HTTP side: the WSGI application (``_app``), one request lifecycle for every protocol (``_invoke``), and one
module per protocol that registers its routes (``sagemaker``, ``runtime``).

Importing a protocol module loads neither the app nor the other protocols.
"""
