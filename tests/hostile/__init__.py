"""Hostile-input attack suite (issue 12): generated inputs for every ingester, trace format and
``replay sim``. Each case runs the real CLI and asserts no traceback, bounded time, the exact
quarantine reason (``file:line: field: reason``) and that the good rows of the same file are
kept. Shared machinery is in :mod:`tests.hostile.support`, the generated payloads in
:mod:`tests.hostile.payloads`."""
