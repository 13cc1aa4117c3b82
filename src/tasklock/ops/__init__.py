"""Operator tooling behind the ``tasklock`` command: inspecting, releasing and checking locks,
and reading the fleet's counts.

Kept apart from :mod:`tasklock.cli` (which only parses arguments and prints) so the logic can be
used and tested without a command line:

* :mod:`tasklock.ops.stores`: where a command looks (the backend the URL's scheme names in
  :mod:`tasklock.backends`), which URLs it
  was given, and the :class:`~tasklock.ops.stores.Store` every command is written against;
* :mod:`tasklock.ops.inspect`: reads Redis lock keys (and the form keys are printed and typed in);
* :mod:`tasklock.ops.permits`: reads and releases a Semaphore's permits on Redis;
* :mod:`tasklock.ops.masters`: ``ls`` across Redlock's masters, merged, with who holds what;
* :mod:`tasklock.ops.fleet_view`: ``stats``, the fleet's counts of one Redis or every master;
* :mod:`tasklock.ops.exporter`: ``exporter``, checks and the hand-over to
  :mod:`tasklock.prometheus`;
* :mod:`tasklock.ops.doctor` and :mod:`tasklock.ops.etcd_doctor`: judge a Redis or etcd setup;
* :mod:`tasklock.ops.etcd_inspect`: the etcd store;
* :mod:`tasklock.ops.zookeeper_inspect`: the ZooKeeper store and doctor;
* :mod:`tasklock.ops.permissions`: what a Redis ACL user may do, for the doctor;
* :mod:`tasklock.ops.render`: the text people read (tables, details, reports);
* :mod:`tasklock.ops.options`: the command's option types.
"""
