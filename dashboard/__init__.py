"""The Streamlit dashboard. ``dashboard/app.py`` is the router (page config, shared sidebar
filters, ``st.navigation``); one file per page in ``dashboard/views/``; figures are pure
functions in ``dashboard/figures.py``; data comes only through ``prefixscope.store.queries``."""
