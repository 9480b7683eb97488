"""The bundled data (real captures, traces, tokenizer, layouts, prices), installed as the package
data of ``prefixscope.data``. Find files through :func:`prefixscope.core.paths.data_dir`."""
