"""Config building and its errors: `UserError`, checks that fail fast, building objects from
config, the config tree a run prints, and the resolvers the configs use."""
