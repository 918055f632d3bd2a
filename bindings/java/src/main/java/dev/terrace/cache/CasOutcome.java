package dev.terrace.cache;

/** What {@link TerraceCache#cas} did. */
public enum CasOutcome {
    /** Stored: the key's CAS was the one given. */
    STORED,
    /** Not stored: the key holds another CAS (someone wrote it since). */
    EXISTS,
    /** Not stored: the key is absent. */
    NOT_FOUND
}
