"""The demo wing, apart from the method (as open_clip keeps open_clip_train/ apart from open_clip/).

* :mod:`adjcap.demo.world`      the synthetic captioning world (rendered scenes, captions, corpus)
* :mod:`adjcap.demo.tiny_clip`, :mod:`~adjcap.demo.tiny_blip`, :mod:`~adjcap.demo.tiny_ifcap`
                                tiny models of the real classes, saved in the released formats
* :mod:`adjcap.demo.tiny`       the tiny world: every role's model built, trained and saved once
* :mod:`adjcap.demo.train`      the short trainings that make the tiny models work on the world
* :mod:`adjcap.demo.synthetic`  random feature rows for the reranker's tests and benchmark

Only the demo command, tests and benchmarks import this package; the method (the rest of ``adjcap``)
never does: the real loaders load what is built here exactly as they load released weights.
"""
