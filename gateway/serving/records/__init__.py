"""What a request leaves behind: its cost record priced and handed to the ledger (`accounting`), the access log
and its writer thread (`access_log`, `line_writer`), the replay log (`request_log`), traces (`tracing`).
May import `gateway.serving.openai` and `gateway.serving.routing` (the completion limit a record names)."""
