"""The store's SQL, one module per thing it keeps (job rows read and changed, events,
memory holds, what ended jobs teach, samples, drains, maintenance). Plain functions over
an open connection: only ``daemon/store.py`` calls them, inside the transactions it owns."""
