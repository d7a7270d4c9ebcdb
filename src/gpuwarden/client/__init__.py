"""What a client needs to talk to a daemon, with the standard library only: where its
socket and state are (``paths``), the API client (``api``), typed views of its answers
(``views``) and the launcher's side of an attached job (``launcher``). The daemon
imports ``paths``, the page sizes and the views from here too, so both sides agree
without talking; nothing here imports the daemon. Empty, so ``cli/fast.py`` pays for
only the module it imports."""
