"""The running policy: held and swapped whole (`policy_holder`), compared with its file, with how its last
reload ended (`policy_file`), reloaded when a watched file changes (`file_watch`). May import
`gateway.control.fleet` (a reload the pools cannot apply yet)."""
