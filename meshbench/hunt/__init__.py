"""`meshbench hunt`: generated request histories against a server, every answer checked against its cold answer
(the same request alone on a server with nothing cached), a confident difference confirmed, then shrunk to a
minimal history that replays it."""
