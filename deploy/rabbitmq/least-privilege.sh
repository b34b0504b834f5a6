#!/bin/sh
# A RabbitMQ user limited to one sasflow namespace on one virtual host. Idempotent.
#
#   SASFLOW_BROKER_PASSWORD='change-me' deploy/rabbitmq/least-privilege.sh NAMESPACE USER [VHOST]
#
# Permissions (regular expressions on resource names, in VHOST, default /):
#   configure ^NS\.                       declare the namespace's queues and exchanges
#   write     ^(NS\..*|amq\.default)$     publish to its exchanges, bind its queues, and
#                                          publish to queues by name (the default exchange,
#                                          which sasflow uses for requests, replies, submissions)
#   read      ^NS\.                       consume and get from its queues, bind from its exchanges
# Write on amq.default lets the user publish to ANY queue of the virtual host by name: give
# each deployment a virtual host of its own when namespaces must not reach each other.
set -eu

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: SASFLOW_BROKER_PASSWORD=... $0 NAMESPACE USER [VHOST]" >&2
    exit 2
fi
namespace=$1
user=$2
vhost=${3:-/}
: "${SASFLOW_BROKER_PASSWORD:?set SASFLOW_BROKER_PASSWORD to the user's password}"
ctl=${RABBITMQCTL:-rabbitmqctl}

# Names are [A-Za-z0-9_.-]: only the dot is special in a regular expression.
ns=$(printf '%s' "$namespace" | sed 's/\./\\./g')

if ! "$ctl" -q list_vhosts name | grep -qxF "$vhost"; then
    "$ctl" -q add_vhost "$vhost"
fi
if "$ctl" -q list_users | cut -f1 | grep -qxF "$user"; then
    "$ctl" -q change_password "$user" "$SASFLOW_BROKER_PASSWORD"
else
    "$ctl" -q add_user "$user" "$SASFLOW_BROKER_PASSWORD"
fi
"$ctl" -q set_permissions -p "$vhost" "$user" "^$ns\\." "^($ns\\..*|amq\\.default)\$" "^$ns\\."
