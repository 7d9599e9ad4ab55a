from research.tasks import redteam


def test_every_attack_is_blocked_and_every_honest_solution_passes(fixture_tasks):
  origin, task_dir, _ = fixture_tasks
  report = redteam.run(origin, task_dir, log=lambda _: None)
  assert report['attacks_tried'] == len(redteam.ATTACKS) >= 20
  assert len({a.kind for a in redteam.ATTACKS}) >= 20
  for a in report['attacks']:
    assert a['blocked'], a
    if a['expected_flag']:
      assert a['flagged'], a
    assert not a['found_leak'], a  # Scrubbing and the sandbox left nothing to find...
    if a['control_found_leak'] is not None:
      assert a['control_found_leak'], a  # ...that the same hunt finds without them.
  # The original of each attacked task, and a rewrite that shares no line with it.
  assert report['honest_passed'] == report['honest_total'] >= len(redteam.TARGETS) + 1
