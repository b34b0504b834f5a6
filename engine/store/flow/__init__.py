"""Flow control (docs/flow-control.md): limits as rows evaluated inside the claim on the database
clock. `model` the limits' definitions and key expressions and `admission` the admission of
candidate steps under budgets (both pure); `limits` the rows, `fleet` the implicit bounds and
breaker holds read from the agent fleet, `plan` what a scheduler caches of them, `queries` and
`claim` the budgeted claim, `state` and `explain` what operators read."""
