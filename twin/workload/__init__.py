"""What arrives: trace readers (:mod:`.traces`), length distributions and the bundled
length tables (:mod:`.lengths`), arrival processes (:mod:`.arrivals`), rate
schedules that warp them over time (:mod:`.schedule`), and the
``workload:`` section turned into a request stream (:mod:`.stream`)."""
