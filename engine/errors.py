"""The one exception tree of sasflow: every error the library raises derives from SasflowError."""

from __future__ import annotations


class SasflowError(Exception):
    """A sasflow operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or type(self).__name__).strip())


class ConfigurationError(SasflowError):
    """The configuration is invalid."""


class AssignmentConflictError(ConfigurationError):
    """A scheduler was started with another assignment strategy than the live ones run."""


class DefinitionChangedError(ConfigurationError):
    """A workflow version was loaded with another definition than the one first registered."""


class DefinitionError(SasflowError):
    """A workflow or agent definition is invalid."""


class AppLoadError(SasflowError):
    """The application module could not be loaded."""


class UnknownWorkflowError(SasflowError):
    """No workflow with that name (and version) is registered."""

    def __init__(self, message: str | None = None, *, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint
        """What is registered instead (`known workflows: order, refund`), for a person to
        read after the message; empty when not known."""


class InvalidMessageError(SasflowError):
    """A message does not follow the sasflow wire protocol."""


class InvalidInputError(SasflowError):
    """The input of a run or step could not be built or is not JSON."""


class BacklogFullError(SasflowError):
    """The workflow has as many runs waiting to start as its bound allows: submit later."""

    def __init__(self, workflow: str, *, backlog: int, bound: int, retry_after: int) -> None:
        super().__init__(
            f"workflow {workflow!r} has {backlog} run(s) waiting to start, its bound is {bound} "
            f"(max_backlog): submit again in {retry_after}s"
        )
        self.workflow = workflow
        self.backlog = backlog
        """Runs waiting to start, counted up to the bound (so at least this many)."""
        self.bound = bound
        self.retry_after = retry_after
        """Seconds after which a new submission may find room (docs/backpressure.md)."""


class StoreUnavailableError(SasflowError):
    """The state store (database) cannot be reached."""


class SchemaOutdatedError(StoreUnavailableError):
    """The database's schema is not the one this sasflow needs (never migrated, or migrated
    behind its head revision): run `sasflow db upgrade`."""


class ConflictError(StoreUnavailableError):
    """A concurrent transaction got in the way (deadlock or serialization failure); retry."""


class BrokerUnavailableError(SasflowError):
    """The message broker cannot be reached."""


class ConsumerCancelledError(BrokerUnavailableError):
    """The broker cancelled a consumer of this connection (its queue deleted, or its node lost)."""

    def __init__(self, queues: tuple[str, ...]) -> None:
        listed = ", ".join(repr(q) for q in queues)
        super().__init__(f"the broker cancelled the consumer of {listed} (queue gone or node lost)")
        self.queues = queues
        """The queues whose consumers the broker cancelled; handled as a lost connection (the
        role connects, declares its queues and consumes again)."""


class PublishError(SasflowError):
    """The broker did not accept a message (unroutable or negatively confirmed)."""


class UnroutableError(PublishError):
    """The broker had no queue for the message (NO_ROUTE): the queue it names does not exist."""


class LeaseLostError(SasflowError):
    """Another holder has the lease now; this one must stop acting on its behalf."""


# -- operator actions (sasflow.ops); the CLI, the HTTP API and the console report them --------


class RunNotFoundError(SasflowError):
    """No run with that id."""


class InvalidActionError(SasflowError):
    """The run is not in a state where this action makes sense."""


class DeadLetterNotFoundError(SasflowError):
    """No dead letter with that id (matching the filters)."""


class AlertNotFoundError(SasflowError):
    """No alert with that id."""


class AlertAlreadyAcknowledgedError(SasflowError):
    """The alert was acknowledged already."""


class IncidentNotFoundError(SasflowError):
    """No incident with that id."""


class IncidentAlreadyAcknowledgedError(SasflowError):
    """The incident was acknowledged already (or closed when its last alert was)."""


class InvalidAcknowledgementError(SasflowError):
    """An acknowledgement needs a reason with text and an actor of 1 to 200 characters."""


class TokenNotFoundError(SasflowError):
    """No live API token with that name."""


class InvalidTokenError(SasflowError):
    """An API token needs a name (letters, digits, '_', '.', '@', '-') and known scopes."""


class InvalidScheduleError(SasflowError):
    """The schedule's definition is invalid (cron or interval, time zone, catch-up policy)."""


class ScheduleNotFoundError(SasflowError):
    """No schedule with that id or name."""


class SchedulerNotFoundError(SasflowError):
    """No scheduler registered with that name."""


class InvalidLimitError(SasflowError):
    """The flow limit's definition is invalid (name, selector, key, rate, burst, concurrency)."""


class LimitNotFoundError(SasflowError):
    """No flow limit with that name."""


# -- refusals: a permanent misconfiguration, not an outage ------------------------------------


class StoreRefusedError(StoreUnavailableError):
    """The database refused this process: authentication failed, or no such role or database."""

    def __init__(self, message: str | None = None, *, never_connected: bool = False) -> None:
        super().__init__(message)
        self.never_connected = never_connected
        """True when this process had not connected before: a configuration to fix, not an
        outage to wait out (roles exit with EX_CONFIG instead of retrying)."""


class BrokerRefusedError(BrokerUnavailableError):
    """The broker refused this process: login refused, no such virtual host or no access."""

    def __init__(self, message: str | None = None, *, never_connected: bool = False) -> None:
        super().__init__(message)
        self.never_connected = never_connected
        """True when this transport had not connected before (see StoreRefusedError)."""


class StaleStreamError(SasflowError):
    """No subscriber's current stream has this Sasflow-Stream-Id (ended, replaced or never
    opened)."""


class SubscriberNotFoundError(SasflowError):
    """No subscriber with that id belongs to this token."""


class InvalidEventError(SasflowError):
    """An inbound event (for event waits) is malformed: the field named is missing or wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ApprovalNotFoundError(SasflowError):
    """The run has no approval step of that name."""


class ApprovalForbiddenError(SasflowError):
    """The token lacks the scope the approval's group of approvers needs."""


class InvalidFormError(SasflowError):
    """An approval's form was refused: `fields` names each field with its reason."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in sorted(fields.items())))
        self.fields = fields
