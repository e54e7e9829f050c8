"""The commands beyond a figure, reached as ``python -m experiments <name>`` (``TOOLS`` in ``experiments/__main__``
names the module with each one's ``main(argv)``): bench, bucket-cost, gpu-check, hostval, predict, simval, timeline,
tune, and ``report`` (the documents' numbers); beside them, the modules they are built from."""
